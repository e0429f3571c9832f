"""The checks that stand in for the Bicep compiler and azd (tests/infra/checks.py): infra/ passes each
one, and each one finds its fault in a small bad template."""

from __future__ import annotations

import json

import pytest

from tests.infra.bicep import INFRA, bicep_files, parse, parse_text
from tests.infra.checks import (
    Finding,
    defaults_outside_their_constraints,
    module_parameter_mismatches,
    parameters_file_mismatches,
    placeholder_host,
    placeholder_hosts,
)

PARAMETERS = json.loads((INFRA / "main.parameters.json").read_text())


@pytest.fixture(scope="module")
def templates() -> dict:
    return {relative: parse(relative) for relative in bicep_files()}


def parameters_file(**values: str) -> dict:
    return {"parameters": {name: {"value": value} for name, value in values.items()}}


# infra/ as it is


def test_every_default_is_allowed_and_in_range(templates: dict) -> None:
    assert [str(f) for f in defaults_outside_their_constraints(templates)] == []


def test_every_module_gets_the_parameters_it_declares(templates: dict) -> None:
    assert [str(f) for f in module_parameter_mismatches(templates)] == []


def test_the_parameters_file_gives_every_required_parameter_of_main(templates: dict) -> None:
    assert [str(f) for f in parameters_file_mismatches(templates["main.bicep"], PARAMETERS)] == []


def test_no_default_holds_a_placeholder_host(templates: dict) -> None:
    assert [str(f) for f in placeholder_hosts(templates, PARAMETERS)] == []


def test_azd_prompts_for_the_fulfilment_url(templates: dict) -> None:
    # azd prompts for a parameter whose ${VAR} is unset only when main.bicep gives it no default
    # (Azure/azure-dev#2895, fixed by #2896).
    assert templates["main.bicep"]["parameters"]["fulfillmentUrl"]["default"] is None
    assert PARAMETERS["parameters"]["fulfillmentUrl"]["value"] == "${FULFILLMENT_URL}"


# each check finds its fault


def test_a_default_outside_its_allowed_values_is_found() -> None:
    template = parse_text("@allowed([\n  '3.11'\n  '3.12'\n])\nparam pythonVersion string = '3.13'\n")
    assert defaults_outside_their_constraints({"main.bicep": template}) == [
        Finding("main.bicep", "pythonVersion", "'3.13' is not among its @allowed values ['3.11', '3.12']")
    ]


@pytest.mark.parametrize(("declaration", "problem"), [
    ("@minValue(5)\nparam lock int = 2", "2 is below its @minValue(5)"),
    ("@maxValue(300)\nparam lock int = 301", "301 is above its @maxValue(300)"),
    ("@minLength(1)\nparam lock string = ''", "'' is shorter than its @minLength(1)"),
    ("@maxLength(3)\nparam lock string = 'abcd'", "'abcd' is longer than its @maxLength(3)"),
])
def test_a_default_out_of_its_range_is_found(declaration: str, problem: str) -> None:
    assert defaults_outside_their_constraints({"m.bicep": parse_text(declaration + "\n")}) == [
        Finding("m.bicep", "lock", problem)
    ]


def test_an_allowed_default_is_not_a_finding() -> None:
    template = parse_text("@allowed([\n  'a'\n  'b'\n])\nparam p string = 'b'\n@minValue(1)\nparam n int = 1\n")
    assert defaults_outside_their_constraints({"m.bicep": template}) == []


MODULE = "param location string\nparam tags object = {}\n"


def module_call(params: str) -> str:
    return f"module queues 'modules/queues.bicep' = {{\n  name: 'queues'\n  params: {{\n{params}  }}\n}}\n"


def test_a_required_module_parameter_not_passed_is_found() -> None:
    main = parse_text(module_call("    tags: {}\n"))
    assert module_parameter_mismatches({"main.bicep": main, "modules/queues.bicep": parse_text(MODULE)}) == [
        Finding("main.bicep", "queues", "required parameter 'location' of modules/queues.bicep is not passed")
    ]


def test_a_module_parameter_the_module_does_not_declare_is_found() -> None:
    main = parse_text(module_call("    location: 'westeurope'\n    sku: 'Standard'\n"))
    assert module_parameter_mismatches({"main.bicep": main, "modules/queues.bicep": parse_text(MODULE)}) == [
        Finding("main.bicep", "queues", "modules/queues.bicep declares no parameter 'sku'")
    ]


def test_a_conditional_module_is_checked_too() -> None:
    main = parse_text("param on bool = true\nmodule queues 'modules/queues.bicep' = if (on) {\n  name: 'queues'\n"
                      "  params: {\n    tags: {}\n  }\n}\n")
    assert [f.problem for f in module_parameter_mismatches({"main.bicep": main,
                                                            "modules/queues.bicep": parse_text(MODULE)})] == [
        "required parameter 'location' of modules/queues.bicep is not passed"
    ]


def test_a_missing_module_file_is_found() -> None:
    main = parse_text(module_call("    location: 'westeurope'\n"))
    assert module_parameter_mismatches({"main.bicep": main}) == [
        Finding("main.bicep", "queues", "module file modules/queues.bicep not found")
    ]


MAIN = "param environmentName string\nparam location string\nparam fulfillmentUrl string\n" \
       "@allowed([\n  'Standard'\n  'Premium'\n])\nparam sku string = 'Standard'\n"


def test_a_required_parameter_missing_from_the_parameters_file_is_found() -> None:
    found = parameters_file_mismatches(parse_text(MAIN), parameters_file(environmentName="${AZURE_ENV_NAME}"))
    assert found == [Finding("main.parameters.json", "fulfillmentUrl", "required by main.bicep and not given")]


def test_azds_own_parameters_need_no_entry_but_must_name_azds_variables() -> None:
    main = parse_text(MAIN)
    assert parameters_file_mismatches(main, parameters_file(fulfillmentUrl="${FULFILLMENT_URL}")) == []
    assert parameters_file_mismatches(main, parameters_file(location="${LOCATION}",
                                                            fulfillmentUrl="${FULFILLMENT_URL}")) == [
        Finding("main.parameters.json", "location", "azd provides it as ${AZURE_LOCATION}; give exactly that")
    ]


def test_a_required_parameter_given_a_default_in_the_parameters_file_is_found() -> None:
    found = parameters_file_mismatches(parse_text(MAIN), parameters_file(fulfillmentUrl="${FULFILLMENT_URL=https://x}"))
    assert found == [Finding("main.parameters.json", "fulfillmentUrl",
                             "required, but ${FULFILLMENT_URL=...} gives it a default, so azd never prompts for it")]


def test_an_undeclared_or_disallowed_entry_in_the_parameters_file_is_found() -> None:
    found = parameters_file_mismatches(parse_text(MAIN), parameters_file(
        fulfillmentUrl="${FULFILLMENT_URL}", sku="${SERVICEBUS_SKU=Basic}", pythonVersion="3.13"))
    assert found == [
        Finding("main.parameters.json", "pythonVersion", "main.bicep declares no such parameter"),
        Finding("main.parameters.json", "sku", "'Basic' is not among its @allowed values ['Standard', 'Premium']"),
    ]


def test_an_optional_allowed_parameter_left_empty_by_an_unset_variable_is_found() -> None:
    found = parameters_file_mismatches(parse_text(MAIN), parameters_file(
        fulfillmentUrl="${FULFILLMENT_URL}", sku="${SERVICEBUS_SKU}"))
    problem = "unset, ${SERVICEBUS_SKU} gives it '': '' is not among its @allowed values ['Standard', 'Premium']"
    assert found == [Finding("main.parameters.json", "sku", problem)]
    assert parameters_file_mismatches(parse_text(MAIN), parameters_file(
        fulfillmentUrl="${FULFILLMENT_URL}", sku="${SERVICEBUS_SKU=Premium}")) == []


@pytest.mark.parametrize("value", [
    "https://fulfilment.example.com", "http://api.example.org/v1", "example.net", "https://localhost:8080",
    "http://127.0.0.1:7071", "https://shop.invalid", "https://fulfilment.test/", "https://contoso.azurewebsites.net",
    "http://orders.example",
])
def test_placeholder_hosts_are_recognised(value: str) -> None:
    assert placeholder_host(value) is not None


@pytest.mark.parametrize("value", [
    "https://fulfilment.shop.io", "PT10M", "3.13", "order-projection", "https://myexample.com",
    "https://example.company.com", "Microsoft.Insights/components", "sb-x.servicebus.windows.net",
])
def test_real_hosts_and_other_values_are_not_placeholders(value: str) -> None:
    assert placeholder_host(value) is None


def test_a_placeholder_in_a_default_or_the_parameters_file_is_found() -> None:
    template = parse_text("param url string = 'https://fulfilment.example.com'\nvar hosts = {\n  a: 'localhost'\n}\n")
    found = placeholder_hosts({"main.bicep": template}, parameters_file(url="${FULFILLMENT_URL=http://127.0.0.1:9}"))
    assert found == [
        Finding("main.bicep", "url", "default holds the placeholder host 'fulfilment.example.com'"),
        Finding("main.bicep", "hosts", "variable holds the placeholder host 'localhost'"),
        Finding("main.parameters.json", "url", "value holds the placeholder host '127.0.0.1'"),
    ]
