"""The template against Azure's published resource types (tests/infra/azure_types), and each check failing on planted
bad text: an unknown property, a read-only one, a value outside a closed enum, a required one missing; on either side
of a ``?:``, in any argument of a ``union()``, in a variable, and under any value a parameter may take."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.infra import flex_consumption
from tests.infra.azure_types import TYPES_FILE, Types, all_findings
from tests.infra.azure_types.regenerate import declared_types
from tests.infra.bicep import INFRA, Scope, main_scope, parse_text

REPO = INFRA.parent


def test_the_vendored_types_name_their_source_and_hold_every_type_the_template_declares() -> None:
    document = json.loads(TYPES_FILE.read_text())
    assert document["source"]["repository"] == "https://github.com/Azure/bicep-types-az"
    assert len(document["source"]["commit"]) == 40
    # Each type the template declares, one by one: a test per type was a parse of every Bicep file at collection,
    # 2 CPU-s in each of the test command's 7 collections.
    declared, published = declared_types(), Types.load().bodies
    assert [name for name in declared if name.lower() not in published] == []
    assert "Microsoft.ServiceBus/namespaces@2026-01-01" in declared  # GA, not 2026-07-01-preview


def test_the_template_matches_azures_published_types_under_every_parameter_value() -> None:
    assert all_findings(main_scope()) == []


def planted(module: str, path: str, old: str, new: str) -> list[str]:
    """The findings of one module of main.bicep, as main instantiates it, with ``old`` replaced by ``new``."""
    text = (INFRA / path).read_text()
    assert old in text, f"{old!r} is not in {path}"
    given = main_scope().module(module).params
    return all_findings(Scope.of(parse_text(text.replace(old, new, 1)), given), label=module)


def test_the_template_matches_azures_published_types_with_the_network_closed_and_open() -> None:
    assert main_scope().params["privateNetwork"] is False
    assert all_findings(main_scope(privateNetwork=True)) == [] and all_findings(main_scope(privateNetwork=False)) == []
    # The network module is checked too: a planted unknown property in it is found.
    found = planted("network", "modules/network.bicep", "registrationEnabled: false", "registrationEnable: false")
    assert any("properties.registrationEnable is not a property" in f for f in found), found


def test_an_unknown_property_is_found() -> None:
    [found] = planted("serviceBus", "modules/servicebus.bicep", "disableLocalAuth: true", "disableLocalAuthz: true")
    assert found == ("serviceBus:namespace: properties.disableLocalAuthz is not a property of SBNamespaceProperties"
                     " (unknown)")


def test_an_unknown_property_in_a_variable_or_a_union_argument_is_found() -> None:
    in_variable = planted("serviceBus", "modules/servicebus.bicep", "deadLetteringOnMessageExpiration: true\n  ",
                          "deadLetteringOnMessageExpiry: true\n  ")
    assert any("properties.deadLetteringOnMessageExpiry is not a property" in f for f in in_variable), in_variable
    in_union = planted("serviceBus", "modules/servicebus.bicep", "requiresSession: false\n  })",
                       "requiresSessions: false\n  })")
    assert any("ordersQueue: properties.requiresSessions is not a property" in f for f in in_union), in_union


def test_a_read_only_property_is_found() -> None:
    found = planted("serviceBus", "modules/servicebus.bicep", "disableLocalAuth: true",
                    "disableLocalAuth: true\n    serviceBusEndpoint: 'https://sb.example'")
    assert found == ["serviceBus:namespace: properties.serviceBusEndpoint is read-only (Azure sets it)"]


def test_a_value_outside_a_closed_enum_is_found_on_either_side_of_a_conditional() -> None:
    found = planted("serviceBus", "modules/servicebus.bicep", "    name: sku\n",
                    "    name: empty(location) ? sku : 'Gold'\n")
    assert found == ["serviceBus:namespace: sku.name is 'Gold', not one of ['Basic', 'Premium', 'Standard'] (enum)"]


def test_an_open_enum_takes_any_value() -> None:
    # Most of Azure's enums are extensible (a plain string among the literals): publicNetworkAccess takes any value.
    assert planted("serviceBus", "modules/servicebus.bicep", "publicAccess ? 'Enabled' : 'Disabled'",
                   "'Sometimes'") == []


def test_a_missing_required_property_is_found() -> None:
    found = planted("serviceBus", "modules/servicebus.bicep", "    name: sku\n", "")
    assert found == ["serviceBus:namespace: sku lacks name, which SBSku requires (required)"]


def test_a_value_a_parameter_may_take_but_azure_refuses_is_found_by_expanding_it() -> None:
    found = planted("serviceBus", "modules/servicebus.bicep", "param sku string",
                    "@allowed(['Standard', 'Premium', 'Platinum'])\nparam sku string")
    assert found == ["serviceBus:namespace: sku.name is 'Platinum', not one of ['Basic', 'Premium', 'Standard'] (enum)",
                     "serviceBus:namespace: sku.tier is 'Platinum', not one of ['Basic', 'Premium', 'Standard'] (enum)"]


def test_the_regenerate_script_trims_a_types_repository_to_what_the_template_declares(tmp_path: Path) -> None:
    # A stand-in for Azure/bicep-types-az: the vendored types as one file per type, under generated/.
    repo = tmp_path / "bicep-types-az"
    document = json.loads(TYPES_FILE.read_text())
    for ref in document["resources"].values():
        folder = repo / "generated" / Path(ref["file"]).relative_to("generated").parent
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "types.json").write_text(json.dumps(document["types"]))
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@example", "-c", "user.name=t", "commit", "-qm", "t"],
                   check=True)
    out = tmp_path / "types.json"
    done = subprocess.run([sys.executable, "-m", "tests.infra.azure_types.regenerate", str(repo), "--output", str(out)],
                          cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    regenerated = json.loads(out.read_text())
    assert set(regenerated["resources"]) == set(document["resources"])
    assert len(regenerated["types"]) == len(document["types"])
    empty = tmp_path / "empty"
    subprocess.run(["git", "init", "-q", str(empty)], check=True)
    (empty / "generated").mkdir()
    (empty / "generated" / "x").write_text("x")
    subprocess.run(["git", "-C", str(empty), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(empty), "-c", "user.email=t@example", "-c", "user.name=t", "commit", "-qm", "t"],
                   check=True)
    missing = subprocess.run([sys.executable, "-m", "tests.infra.azure_types.regenerate", str(empty), "--output",
                              str(tmp_path / "none.json")], cwd=REPO, capture_output=True, text=True, check=False)
    assert missing.returncode == 1 and missing.stderr.startswith("error: not in Azure/bicep-types-az at ")
    assert "Traceback" not in missing.stderr


def flex_site(text: str | None = None) -> tuple[dict, dict]:
    """The function app's site body and app settings, evaluated as main instantiates the module."""
    scope = main_scope().module("functionApp")
    if text is not None:
        scope = Scope.of(parse_text(text), scope.params)
    found = scope.resources()
    return found["site"]["config"], found["site__settings"]["config"]["properties"]


def test_the_flex_consumption_site_sets_nothing_flex_refuses_or_ignores() -> None:
    site, settings = flex_site()
    assert site["kind"] == "functionapp,linux" and "functionAppConfig" in site["properties"]
    assert flex_consumption.site_findings(site, settings) == []


@pytest.mark.parametrize(("old", "new", "finding"), [
    ("minTlsVersion: '1.2'", "minTlsVersion: '1.2'\n      ftpsState: 'Disabled'",
     "properties.siteConfig.ftpsState is refused by Flex Consumption"),
    ("minTlsVersion: '1.2'", "minTlsVersion: '1.2'\n      http20Enabled: true",
     "properties.siteConfig.http20Enabled is ignored by Flex Consumption"),
    ("APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'Authorization=AAD'",
     "APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'Authorization=AAD'\n      FUNCTIONS_WORKER_RUNTIME: 'python'",
     "app setting FUNCTIONS_WORKER_RUNTIME is not used by Flex Consumption"),
])
def test_a_property_or_setting_flex_refuses_or_ignores_is_found(old: str, new: str, finding: str) -> None:
    text = (INFRA / "modules" / "functionapp.bicep").read_text()
    assert old in text
    site, settings = flex_site(text.replace(old, new, 1))
    assert flex_consumption.site_findings(site, settings) == [finding]
