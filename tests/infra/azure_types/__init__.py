"""A check of the Bicep template against Azure's published resource types (``types.json``, see regenerate.py).

For every resource of ``infra/`` (main.bicep and the modules it deploys, each loop copy, whatever its ``if``),
it walks each property path the template sets, both sides of each ``?:`` and every argument of each
``union()``, with variables and parameters expanded, and finds:

- a property the type does not have (``unknown``);
- a property Azure sets itself (``read-only``);
- a literal outside a closed enum (``enum``: a union of string literals only; an enum with a string among
  its elements is open and takes any value);
- an object that lacks a property the type requires (``required``).

It cannot see what only Azure knows (a resource's output, an endpoint): such a value is checked for
nothing but its place. ``findings`` returns one line per problem, naming the resource, the path and why.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tests.infra.bicep import Scope, _expression, declaration, iterations

TYPES_FILE = Path(__file__).resolve().parent / "types.json"
REQUIRED, READ_ONLY = 1, 2  # the flags of a property in types.json
# Keys of a resource declaration that are Bicep's own, not properties of the resource's body.
BICEP_KEYWORDS = frozenset({"parent", "scope", "dependsOn", "depends_on"})  # pycep spells dependsOn depends_on


@dataclass(frozen=True)
class Types:
    """One types.json: its entries, and each resource type's body by ``Type@api-version`` (lower-cased)."""

    entries: list[dict[str, Any]]
    bodies: Mapping[str, int]

    @classmethod
    def load(cls, path: Path = TYPES_FILE) -> Types:
        """The vendored subset (or any types.json the regenerate script writes)."""
        return cls.of(json.loads(path.read_text()))

    @classmethod
    def of(cls, document: Mapping[str, Any]) -> Types:
        entries = document["types"]
        bodies = {}
        for name, ref in document["resources"].items():
            resource = entries[_index(ref)]
            bodies[name.lower()] = _index(resource["body"])
        return cls(entries, bodies)

    def get(self, ref: Mapping[str, str] | int) -> dict[str, Any]:
        return self.entries[ref if isinstance(ref, int) else _index(ref)]


def _index(ref: Mapping[str, str]) -> int:
    return int(ref["$ref"].removeprefix("#/"))


@dataclass
class Walk:
    """The check of one resource's body, in the scope of its template (and loop copy)."""

    types: Types
    scope: Scope
    where: str
    found: list[str]

    def node(self, node: Any, type_index: int, path: str) -> None:
        """Check a raw pycep node set at ``path`` against the type entry at ``type_index``."""
        if isinstance(node, dict) and _expression(node, "operator") and node["operator"]["type"] == "conditional":
            operands = node["operator"]["operands"]
            self.node(operands["true_value"], type_index, path)
            self.node(operands["false_value"], type_index, path)
        elif isinstance(node, dict) and _expression(node, "function") and node["function"]["type"] == "union":
            arguments = list(node["function"].get("parameters", {}).values())
            for argument in arguments:
                self.object(argument, type_index, path, require=False)
            self._required(self._keys_of_union(arguments), type_index, path)
        elif isinstance(node, str) and node in self.scope.template.get("variables", {}) \
                and node not in self.scope.params and node not in self.scope.resolving:
            inner = Scope(self.scope.template, self.scope.params, self.scope.resolving | {node})
            Walk(self.types, inner, self.where, self.found).node(
                self.scope.template["variables"][node]["value"], type_index, path)
        elif isinstance(node, dict) and not _expression(node, "function") and not _expression(node, "operator"):
            self.object(node, type_index, path, require=True)
        elif isinstance(node, list):
            for item in node:
                self.node(item, self._item(type_index), f"{path}[]")
        else:
            self.value(self.scope.evaluate(node), type_index, path)

    def object(self, node: Any, type_index: int, path: str, *, require: bool) -> None:
        """Check an object set at ``path``: each of its keys, and (``require``) what the type requires."""
        if not isinstance(node, dict) or _expression(node, "function") or _expression(node, "operator"):
            self.node(node, type_index, path)
            return
        properties, additional = self._properties(type_index, node)
        if properties is None:
            return
        for quoted, value in node.items():
            key = quoted.strip("'")  # pycep keeps the quotes of a quoted key ('odata.type')
            if path == "" and key in BICEP_KEYWORDS:
                continue
            if (child := self._member(key, properties, additional, type_index, path)) is not None:
                self.node(value, *child)
        if require:
            self._required([{key.strip("'") for key in node}], type_index, path)

    def value(self, value: Any, type_index: int, path: str) -> None:
        """Check an evaluated value (a parameter's, or a leaf's) against the type."""
        entry = self.types.get(type_index)
        if isinstance(value, dict):
            properties, additional = self._properties(type_index, value)
            if properties is None:
                return
            for key, item in value.items():
                if (child := self._member(key, properties, additional, type_index, path)) is not None:
                    self.value(item, *child)
            self._required([set(value)], type_index, path)
        elif isinstance(value, list):
            for item in value:
                self.value(item, self._item(type_index), f"{path}[]")
        elif isinstance(value, str) and "<" not in value and (allowed := self._closed(entry)) is not None \
                and value not in allowed:
            self.found.append(f"{self.where}: {path} is {value!r}, not one of {sorted(allowed)} (enum)")

    def _member(self, key: str, properties: Mapping[str, Any], additional: int | None, type_index: int,
                path: str) -> tuple[int, str] | None:
        """The type of the property ``key`` set at ``path`` and its own path, to check what it holds; None (the
        finding noted) when the type has no such property. A read-only one is noted, and checked all the same."""
        here = f"{path}.{key}" if path else key
        spec = properties.get(key)
        if spec is None:
            if additional is not None:
                return additional, here
            self.found.append(f"{self.where}: {here} is not a property of {self._name(type_index)} (unknown)")
            return None
        if spec.get("flags", 0) & READ_ONLY:
            self.found.append(f"{self.where}: {here} is read-only (Azure sets it)")
        return _index(spec["type"]), here

    def _properties(self, type_index: int, value: Mapping[str, Any]) -> tuple[dict[str, Any] | None, int | None]:
        """The properties an object of the type may have, and the type of any other key (a dictionary's)."""
        entry = self.types.get(type_index)
        kind = entry["$type"]
        if kind == "ObjectType":
            additional = entry.get("additionalProperties")
            return dict(entry.get("properties", {})), None if additional is None else _index(additional)
        if kind == "DiscriminatedObjectType":
            properties = dict(entry.get("baseProperties", {}))
            keys = {key.strip("'"): key for key in value}
            discriminator = keys.get(entry["discriminator"])
            chosen = self.scope.evaluate(value[discriminator]) if discriminator is not None else None
            for name, ref in entry["elements"].items():
                if chosen is None or chosen == name:
                    properties.update(self.types.get(ref).get("properties", {}))
            return properties, None
        if kind == "UnionType":
            objects = [self.types.get(ref) for ref in entry["elements"]]
            properties = {}
            for element in objects:
                properties.update(element.get("properties", {}))
            return (properties, None) if properties else (None, None)
        return None, None  # AnyType, or a value this walk cannot type

    def _required(self, alternatives: list[set[str] | None], type_index: int, path: str) -> None:
        entry = self.types.get(type_index)
        if entry["$type"] != "ObjectType":
            return
        required = {name for name, spec in entry.get("properties", {}).items() if spec.get("flags", 0) & REQUIRED}
        for keys in alternatives:
            if keys is None:
                continue
            for name in sorted(required - keys):
                self.found.append(f"{self.where}: {path or 'the body'} lacks {name}, which"
                                  f" {self._name(type_index)} requires (required)")

    def _keys_of_union(self, arguments: list[Any]) -> list[set[str] | None]:
        """The keys of a ``union()`` of objects: each argument's, merged (None when one cannot be known)."""
        merged: set[str] = set()
        for argument in arguments:
            value = self.scope.evaluate(argument)
            if not isinstance(value, dict):
                return [None]
            merged |= set(value)
        return [merged]

    def _item(self, type_index: int) -> int:
        entry = self.types.get(type_index)
        return _index(entry["itemType"]) if entry["$type"] == "ArrayType" else type_index

    def _closed(self, entry: Mapping[str, Any]) -> set[str] | None:
        """The values a closed enum takes; None when the type is not one (an open enum takes any string)."""
        if entry["$type"] == "StringLiteralType":
            return {entry["value"]}
        if entry["$type"] == "UnionType":
            elements = [self.types.get(ref) for ref in entry["elements"]]
            if elements and all(e["$type"] == "StringLiteralType" for e in elements):
                return {e["value"] for e in elements}
        return None

    def _name(self, type_index: int) -> str:
        return str(self.types.get(type_index).get("name", f"type #{type_index}"))


@dataclass(frozen=True)
class Declared:
    """One copy of one resource declaration: where it is, its type, the scope it is evaluated in, its raw body."""

    where: str
    type_name: str
    scope: Scope
    body: Any
    existing: bool


def resources(scope: Scope, label: str) -> Iterator[Declared]:
    """Each resource of a template and of the modules it deploys, once per loop copy, whatever its ``if``."""
    for name, resource in scope.template.get("resources", {}).items():
        loop, _, body = declaration(resource["config"])
        type_name = f"{resource['type']}@{resource['api_version']}"
        copies = iterations(scope, {"deployed": True, "loop": loop}) if loop else [scope]
        for copy in copies:
            yield Declared(f"{label}:{name}", type_name, copy, body, bool(resource.get("existing")))
    for name in scope.template.get("modules", {}):
        yield from resources(scope.module(name), f"{label}/{name}")


def findings(scope: Scope, types: Types | None = None, label: str = "main") -> list[str]:
    """Every problem of the template in ``scope`` (and its modules) against the types."""
    types = types or _vendored()
    found: list[str] = []
    for declared in resources(scope, label):
        index = types.bodies.get(declared.type_name.lower())
        if index is None:
            found.append(f"{declared.where}: {declared.type_name} is not in the vendored types (regenerate them)")
        elif not declared.existing:  # an existing resource is declared elsewhere: only its name is set here
            Walk(types, declared.scope, declared.where, found).object(declared.body, index, "", require=True)
    return found


def expanded(scope: Scope) -> Iterator[Scope]:
    """The scope as given, then once for each other value a parameter may take (each value of its ``@allowed``
    list, each boolean's other value), the others at their defaults."""
    yield scope
    for name, spec in scope.template.get("parameters", {}).items():
        decorators: list[Any] = list(spec.get("decorators", []))
        allowed = next((d.get("argument") for d in decorators if d.get("type") == "allowed"), None)
        values = allowed if isinstance(allowed, list) else [True, False] if spec.get("type") == "bool" else []
        for value in values:
            if value != scope.params.get(name):
                yield Scope.of(scope.template, {**scope.params, name: value})


def all_findings(scope: Scope, types: Types | None = None, label: str = "main") -> list[str]:
    """The findings of every expansion of the scope's parameters, each once."""
    return list(dict.fromkeys(f for each in expanded(scope) for f in findings(each, types, label)))


@cache
def _vendored() -> Types:
    return Types.load()
