"""Read the Bicep templates with pycep-parser and evaluate the simple expressions they use.

Enough of Bicep to check what matters statically: parameters with their defaults, variables,
module parameters, conditions (``if``), string interpolation of names and property paths
(``${a.b}``), ``union``, ``string``, ``empty`` and ``!``. Anything else (resource properties known
only at deployment, such as endpoints) evaluates to an ``Unresolved`` marker: a property of a
resource reads as ``Unresolved("<resource>.<property>")`` (of a nested child, ``<parent>::<child>.<property>``),
an item of a resource loop as
``Unresolved("<resource>[<index>]")``, ``guid(a, b)`` as ``Unresolved("guid(a, b)")`` with its
arguments evaluated, and an unresolved part of a string as ``<a.b>``.

pycep gives identifiers and string literals alike as Python strings, so a literal that happens to
spell a parameter's or variable's name reads as that name's value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from pycep import BicepParser
from pycep.typing import BicepJson

INFRA = Path(__file__).resolve().parents[2] / "infra"
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\}")


@dataclass(frozen=True)
class Unresolved:
    """A value only Azure knows (an output, a resource property), or an expression we don't evaluate."""

    expression: str


@cache
def parse(relative: str) -> BicepJson:
    """The pycep parse of one Bicep file under infra/."""
    return parse_text((INFRA / relative).read_text())


@cache
def _parser() -> BicepParser:
    """One parser for every parse: building pycep's Lark parser takes most of a second, a parse far less."""
    return BicepParser()


def parse_text(text: str) -> BicepJson:
    """The pycep parse of Bicep source text."""
    return _parser().parse(text=text)


def declaration(config: Any) -> tuple[dict[str, Any] | None, Any, Any]:
    """A resource's or module's config split into (loop, condition, body); pycep nests the body under
    ``config`` when the declaration has a loop or a condition."""
    if isinstance(config, dict) and ("loop_type" in config or "condition" in config):
        return config.get("loop_type"), config.get("condition"), config["config"]
    return None, None, config


def bicep_files() -> list[str]:
    """Every Bicep file under infra/, relative to it."""
    return sorted(str(p.relative_to(INFRA)) for p in INFRA.rglob("*.bicep"))


@dataclass
class Scope:
    """The names visible in one template: parameter values and variable expressions."""

    template: BicepJson
    params: dict[str, Any] = field(default_factory=dict)
    resolving: frozenset[str] = frozenset()  # variables being evaluated: a name inside its own value is a literal

    @classmethod
    def with_defaults(cls, relative: str, given: dict[str, Any] | None = None) -> Scope:
        """A template's scope with each parameter's default unless ``given`` overrides it."""
        return cls.of(parse(relative), given)

    @classmethod
    def of(cls, template: BicepJson, given: dict[str, Any] | None = None) -> Scope:
        """A parsed template's scope: ``given`` values, else each parameter's default, evaluated."""
        given = given or {}
        literal = cls(template, dict(given))
        params = {name: given[name] if name in given else literal.evaluate(spec.get("default"))
                  for name, spec in template.get("parameters", {}).items()}
        return cls(template, {**given, **params})

    def evaluate(self, node: Any) -> Any:
        """Evaluate a parsed expression in this scope."""
        if isinstance(node, str):
            return self._name_or_text(node)
        if isinstance(node, list):
            return [self.evaluate(item) for item in node]
        if isinstance(node, dict):
            if _expression(node, "function"):
                return self._function(node["function"])
            if _expression(node, "operator"):
                return self._operator(node["operator"])
            return {key: self.evaluate(value) for key, value in node.items()}
        return node

    def _name_or_text(self, text: str) -> Any:
        if text in self.params:
            return self.params[text]
        variables = self.template.get("variables", {})
        if text in variables and text not in self.resolving:
            inner = Scope(self.template, self.params, self.resolving | {text})
            return inner.evaluate(variables[text]["value"])
        if "${" in text:

            def substitute(match: re.Match[str]) -> str:
                name, *path = match.group(1).split(".")
                value = self._name_or_text(name)
                for key in path:
                    value = _access(value, key)
                return f"<{match.group(1)}>" if isinstance(value, Unresolved) else str(value)

            return _INTERPOLATION.sub(substitute, text)
        if text in self.template.get("resources", {}) or text in self.template.get("modules", {}):
            return Unresolved(text)
        return text

    def _function(self, function: dict[str, Any]) -> Any:
        arguments = [self.evaluate(value) for value in function.get("parameters", {}).values()]
        if function["type"] == "union" and all(isinstance(a, dict) for a in arguments):
            merged: dict[str, Any] = {}
            for argument in arguments:
                merged.update(argument)
            return merged
        if function["type"] == "string" and len(arguments) == 1:
            return str(arguments[0])
        if function["type"] == "empty" and len(arguments) == 1 and isinstance(arguments[0], str | list | dict):
            return len(arguments[0]) == 0
        if function["type"] == "guid":
            # Deterministic in its arguments, which is what a role assignment's name must be; keep them readable.
            return Unresolved(f"guid({', '.join(_text(a) for a in arguments)})")
        return Unresolved(f"{function['type']}(...)")

    def _operator(self, operator: dict[str, Any]) -> Any:
        operands = operator["operands"]
        if operator["type"] == "minus" and "integer_value" in operands:
            return -int(operands["integer_value"])
        if operator["type"] == "equals":
            return self.evaluate(operands["operand_1"]) == self.evaluate(operands["operand_2"])
        if operator["type"] == "not":
            value = self.evaluate(operands["bool_value"])
            return not value if isinstance(value, bool) else Unresolved("not")
        if operator["type"] == "conditional":
            condition = self.evaluate(operands["condition"])
            if isinstance(condition, bool):
                return self.evaluate(operands["true_value"] if condition else operands["false_value"])
        if operator["type"] == "property_accessor":
            return _access(self.evaluate(operator["operands"]["operand_1"]), operator["operands"]["operand_2"])
        if operator["type"] == "nested_resource_accessor":  # parent::child.property, a child resource's property
            child = operator["operands"]["operand_2"]["operator"]["operands"]
            parent, name, key = operands["operand_1"], child["operand_1"], child["operand_2"]
            return Unresolved(f"{_text(parent)}::{_text(name)}.{_text(key)}")
        if operator["type"] == "index_accessor":
            target = self.evaluate(operator["operands"]["operand_1"])
            index = self.evaluate(operator["operands"]["operand_2"])
            if isinstance(target, list) and isinstance(index, int) and 0 <= index < len(target):
                return target[index]
            if isinstance(target, Unresolved):
                return Unresolved(f"{target.expression}[{_text(index)}]")
        return Unresolved(operator["type"])

    def resources(self) -> dict[str, dict[str, Any]]:
        """Each resource by symbolic name: type, whether it is ``existing``, whether it is deployed (its
        ``if`` condition: True without one, Unresolved if it cannot be evaluated), and its evaluated config."""
        found = {}
        for name, resource in self.template.get("resources", {}).items():
            loop, condition, body = declaration(resource["config"])
            found[name] = {
                "type": resource["type"],
                "existing": resource.get("existing", False),
                "loop": loop,
                "deployed": True if condition is None else self.evaluate(condition),
                "raw": body,
                "config": self.evaluate(body),
            }
        return found

    def deploys_module(self, symbolic_name: str) -> Any:
        """Whether this template deploys the module: its ``if`` condition evaluated (True without one)."""
        _, condition, _ = declaration(self.template["modules"][symbolic_name]["config"])
        return True if condition is None else self.evaluate(condition)

    def module(self, symbolic_name: str) -> Scope:
        """The scope of a module as this template instantiates it."""
        module = self.template["modules"][symbolic_name]
        path = module["detail"].get("path")
        assert module["type"] == "local" and isinstance(path, str), f"{symbolic_name} is not a local module"
        _, _, body = declaration(module["config"])
        given = {name: self.evaluate(value) for name, value in body.get("params", {}).items()}
        return Scope.with_defaults(path, given)


def _expression(node: dict[str, Any], kind: str) -> bool:
    """Whether ``node`` is pycep's function or operator node, not an object with such a property
    (a metric alert's criterion has ``operator: 'GreaterThan'``)."""
    return len(node) == 1 and isinstance(node.get(kind), dict) and "type" in node[kind]


def _access(target: Any, key: Any) -> Any:
    """``target.key``; pycep parses ``a.b.c`` as ``a.(b.c)``, so a key can itself be an accessor."""
    if isinstance(key, dict) and key.get("operator", {}).get("type") == "property_accessor":
        operands = key["operator"]["operands"]
        return _access(_access(target, operands["operand_1"]), operands["operand_2"])
    if isinstance(target, dict) and isinstance(key, str) and key in target:
        return target[key]
    if isinstance(target, Unresolved) and isinstance(key, str):
        return Unresolved(f"{target.expression}.{key}")
    return Unresolved("property_accessor")


def _text(value: Any) -> str:
    return value.expression if isinstance(value, Unresolved) else str(value)


MAIN_REQUIRED = {"environmentName": "dev", "location": "westeurope", "fulfillmentUrl": "https://fulfilment.example"}


def main_scope(**overrides: Any) -> Scope:
    """main.bicep with its parameter defaults and test values for the required ones."""
    return Scope.with_defaults("main.bicep", {**MAIN_REQUIRED, **overrides})


def iterations(scope: Scope, resource: dict[str, Any]) -> list[Scope]:
    """The scope of each copy of a resource: one per loop item (with its item and index names), one
    without a loop, none when its condition is false."""
    if resource["deployed"] is False:
        return []
    loop = resource["loop"]
    if not loop:
        return [scope]
    detail = loop["detail"]
    copies = []
    for index, item in enumerate(scope.evaluate(detail["array_name"])):
        names = {detail["item_name"]: item}
        if detail.get("index_name"):
            names[detail["index_name"]] = index
        copies.append(Scope(scope.template, {**scope.params, **names}))
    return copies


def expand(scope: Scope, resource: dict[str, Any]) -> list[dict[str, Any]]:
    """A resource's evaluated config, once per copy (see ``iterations``)."""
    return [copy.evaluate(resource["raw"]) for copy in iterations(scope, resource)]


def role_guid(scope: Scope, resource: dict[str, Any]) -> list[str]:
    """The role-definition GUIDs a (possibly looped) role-assignment resource assigns, one per copy."""
    raw_role = resource["raw"]["properties"]["roleDefinitionId"]["function"]["parameters"]["resource_name_1"]
    return [copy.evaluate(raw_role) for copy in iterations(scope, resource)]
