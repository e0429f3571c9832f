"""What the Bicep compiler, ARM or azd would refuse before anything is made, checked over pycep's parse.

pycep-parser and checkov parse Bicep but neither type-checks it, so these checks stand in for a few of
the compiler's. Each takes parsed templates (a path relative to infra/ -> pycep's parse) and returns its
findings, so a test can feed it a small bad template and expect the finding. What they cannot see is
listed in docs/deploy.md ("What the checks cannot see").
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from pycep.typing import BicepJson

from tests.infra.bicep import Scope, Unresolved, declaration

Templates = Mapping[str, BicepJson]

# azd fills these two from the environment it creates (`azd env new`, `azd up`).
AZD_PROVIDED = {"environmentName": "AZURE_ENV_NAME", "location": "AZURE_LOCATION"}
# ${NAME}, ${NAME=default}, ${NAME:=default}, ${NAME-default}, ${NAME:-default}: azd's envsubst forms.
_REFERENCE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::?[-=](?P<default>[^}]*))?\}")
_HOST = re.compile(r"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*")
# RFC 2606 / RFC 6761 names that never reach a real service, and the docs' sample company.
_PLACEHOLDER_DOMAINS = ("example.com", "example.org", "example.net")
_PLACEHOLDER_TLDS = ("example", "invalid", "localhost", "test")


@dataclass(frozen=True)
class Finding:
    """One thing the compiler, ARM or azd would refuse: where, which name, and why."""

    file: str
    name: str
    problem: str

    def __str__(self) -> str:
        return f"{self.file}: {self.name}: {self.problem}"


def defaults_outside_their_constraints(templates: Templates) -> list[Finding]:
    """Every parameter default is among its @allowed values and within its @minValue/@maxValue and
    @minLength/@maxLength (a default that is an expression we cannot evaluate is skipped)."""
    findings = []
    for file, template in templates.items():
        scope = Scope.of(template)
        for name, spec in template.get("parameters", {}).items():
            if spec.get("default") is None:
                continue
            value = scope.params[name]
            if not isinstance(value, Unresolved):
                findings += [Finding(file, name, problem) for problem in _violations(value, spec["decorators"])]
    return findings


def module_parameter_mismatches(templates: Templates) -> list[Finding]:
    """Each module declaration passes every parameter the module requires (declared without a default)
    and none that the module does not declare; the module's file exists."""
    findings = []
    for file, template in templates.items():
        for symbolic, module in template.get("modules", {}).items():
            relative = module["detail"].get("path")
            if not isinstance(relative, str):  # a registry or template-spec module: not ours to read
                continue
            path = str(PurePosixPath(file).parent / relative).removeprefix("./")
            if path not in templates:
                findings.append(Finding(file, symbolic, f"module file {path} not found"))
                continue
            _, _, body = declaration(module["config"])
            passed = set(body.get("params", {}))
            declared = templates[path].get("parameters", {})
            required = {name for name, spec in declared.items() if spec.get("default") is None}
            findings += [Finding(file, symbolic, f"required parameter {name!r} of {path} is not passed")
                         for name in sorted(required - passed)]
            findings += [Finding(file, symbolic, f"{path} declares no parameter {name!r}")
                         for name in sorted(passed - set(declared))]
    return findings


def parameters_file_mismatches(main: BicepJson, parameters: Mapping[str, Any],
                               file: str = "main.parameters.json") -> list[Finding]:
    """main.parameters.json against main.bicep, as azd reads it: every required parameter has an entry
    (or is one azd provides), a required one gets no default through ``${VAR=default}`` (azd prompts for
    it only without one), azd's own two reference azd's variables, no entry names an undeclared
    parameter, and a literal value, a ``${VAR=default}`` default or the '' that an unset ``${VAR}``
    gives an optional parameter is among the @allowed values."""
    declared = main.get("parameters", {})
    entries = {name: entry.get("value") for name, entry in parameters.get("parameters", {}).items()}
    findings = [Finding(file, name, "main.bicep declares no such parameter")
                for name in entries if name not in declared]
    for name, spec in declared.items():
        required = spec.get("default") is None
        if name not in entries:
            if required and name not in AZD_PROVIDED:
                findings.append(Finding(file, name, "required by main.bicep and not given"))
            continue
        value = entries[name]
        reference = _REFERENCE.fullmatch(value) if isinstance(value, str) else None
        if name in AZD_PROVIDED and (reference is None or reference["name"] != AZD_PROVIDED[name]):
            findings.append(Finding(file, name, f"azd provides it as ${{{AZD_PROVIDED[name]}}}; give exactly that"))
        if reference is not None and reference["default"] is not None and required:
            findings.append(Finding(file, name, f"required, but ${{{reference['name']}=...}} gives it a default, "
                                                "so azd never prompts for it"))
        if reference is not None and reference["default"] is None and not required:
            # azd prompts only for a required one; an unset variable gives an optional one ''.
            findings += [Finding(file, name, f"unset, ${{{reference['name']}}} gives it '': {problem}")
                         for problem in _violations("", spec["decorators"]) if "@allowed" in problem]
        candidate = value if reference is None else reference["default"]
        if candidate is not None and "${" not in str(candidate):
            findings += [Finding(file, name, problem) for problem in _violations(candidate, spec["decorators"])]
    return findings


def placeholder_hosts(templates: Templates, parameters: Mapping[str, Any],
                      parameters_file: str = "main.parameters.json") -> list[Finding]:
    """No default holds a placeholder host: not a parameter default or variable of any template, not a
    value of the parameters file, nor a ``${VAR=default}`` default in it."""
    findings = []
    for file, template in templates.items():
        for name, spec in template.get("parameters", {}).items():
            findings += [Finding(file, name, f"default holds the placeholder host {host!r}")
                         for host in _placeholders(spec.get("default"))]
        for name, variable in template.get("variables", {}).items():
            findings += [Finding(file, name, f"variable holds the placeholder host {host!r}")
                         for host in _placeholders(variable.get("value"))]
    for name, entry in parameters.get("parameters", {}).items():
        findings += [Finding(parameters_file, name, f"value holds the placeholder host {host!r}")
                     for host in _placeholders(entry.get("value"))]
    return findings


def placeholder_host(text: str) -> str | None:
    """The first placeholder host in ``text``: example.com/.org/.net or a subdomain, a name under
    .example, .invalid, .localhost or .test, localhost, a loopback address, or anything naming contoso."""
    host: str
    for host in _HOST.findall(text):
        if _is_placeholder(host.lower()):
            return host
    return None


def _is_placeholder(host: str) -> bool:
    labels = host.split(".")
    return (host == "localhost" or "contoso" in host or _loopback(host)
            or (len(labels) > 1 and labels[-1] in _PLACEHOLDER_TLDS)
            or any(host == domain or host.endswith(f".{domain}") for domain in _PLACEHOLDER_DOMAINS))


def _placeholders(value: Any) -> Iterator[str]:
    for text in _strings(value):
        host = placeholder_host(text)
        if host is not None:
            yield host


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _violations(value: Any, decorators: Sequence[Any]) -> Iterator[str]:
    for decorator in decorators:
        kind: str = decorator["type"]
        argument: Any = decorator.get("argument")
        if kind == "allowed" and value not in argument:
            yield f"{value!r} is not among its @allowed values {argument}"
        elif kind == "min_value" and isinstance(value, int) and value < argument:
            yield f"{value!r} is below its @minValue({argument})"
        elif kind == "max_value" and isinstance(value, int) and value > argument:
            yield f"{value!r} is above its @maxValue({argument})"
        elif kind == "min_length" and isinstance(value, str | list) and len(value) < argument:
            yield f"{value!r} is shorter than its @minLength({argument})"
        elif kind == "max_length" and isinstance(value, str | list) and len(value) > argument:
            yield f"{value!r} is longer than its @maxLength({argument})"
