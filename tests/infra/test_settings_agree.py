"""The app settings Bicep sets agree with the settings the code reads, and retention holds with the defaults."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from shared.settings import SETTINGS, Settings
from tests.infra.bicep import main_scope

ROOT = Path(__file__).resolve().parents[2]
# Read by the Functions host itself, not by our code: its storage and telemetry.
PLATFORM_SETTINGS = {
    "AzureWebJobsStorage__accountName",
    "APPLICATIONINSIGHTS_CONNECTION_STRING",
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
}
# The identity-based suffix the host reads for each trigger's connection prefix.
IDENTITY_SUFFIX = {"serviceBusTrigger": "fullyQualifiedNamespace", "cosmosDBTrigger": "accountEndpoint"}


def bicep_app_settings() -> dict[str, object]:
    """The function app's appsettings resource, evaluated: union(appSettings from main, host settings)."""
    settings = main_scope().module("functionApp").resources()["site__settings"]["config"]["properties"]
    assert isinstance(settings, dict)
    return settings


def trigger_connection_settings() -> set[str]:
    """From the functions' own binding definitions, as the worker reports them to the host."""
    code = (
        "import json, function_app; print(json.dumps([json.loads(f.get_function_json())['bindings'][0] "
        "for f in function_app.app.get_functions()]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    bindings = json.loads(out.stdout.strip().splitlines()[-1])
    return {f"{b['connection']}__{IDENTITY_SUFFIX[b['type']]}" for b in bindings if b.get("connection")}


def test_every_setting_azure_must_supply_is_set_by_bicep() -> None:
    needed = {s.name for s in SETTINGS.values() if s.in_azure} | trigger_connection_settings() | PLATFORM_SETTINGS
    assert needed - set(bicep_app_settings()) == set()


def test_bicep_sets_nothing_the_app_or_host_leaves_unread() -> None:
    read = set(SETTINGS) | trigger_connection_settings() | PLATFORM_SETTINGS
    assert set(bicep_app_settings()) - read == set()


def test_no_key_or_connection_string_reaches_azure() -> None:
    settings = bicep_app_settings()
    assert "COSMOS_KEY" not in settings
    assert "ServiceBusConnection" not in settings
    assert "CosmosDBConnection" not in settings
    assert not any("key" in str(value).lower() for value in settings.values() if isinstance(value, str))


def test_servicebus_settings_derive_from_the_queue_parameters() -> None:
    main = main_scope(lockDurationSeconds=45, maxDeliveryCount=7, messageTtlSeconds=3600)
    settings = main.module("functionApp").params["appSettings"]
    queue = main.module("serviceBus").resources()["ordersQueue"]["config"]["properties"]
    assert (settings["SERVICEBUS_LOCK_DURATION_SECONDS"], queue["lockDuration"]) == ("45", "PT45S")
    assert (settings["SERVICEBUS_MAX_DELIVERY_COUNT"], queue["maxDeliveryCount"]) == ("7", 7)
    assert (settings["SERVICEBUS_MESSAGE_TTL_SECONDS"], queue["defaultMessageTimeToLive"]) == ("3600", "PT3600S")


def test_retention_rule_holds_with_the_parameter_defaults() -> None:
    settings = bicep_app_settings()
    retention = Settings.from_env({k: v for k, v in settings.items() if isinstance(v, str)}).retention
    assert retention.check() is retention
    assert retention.dedup_ttl_seconds == 777600


def test_retention_rule_catches_a_short_dedup_ttl_in_the_parameters() -> None:
    main = main_scope(dedupTtlSeconds=3600)
    settings = main.module("functionApp").params["appSettings"]
    retention = Settings.from_env({k: v for k, v in settings.items() if isinstance(v, str)}).retention
    try:
        retention.check()
    except Exception as exc:  # ConfigurationError, with the computation
        assert "706200" in str(exc)
    else:
        raise AssertionError("a 1-hour dedup TTL must fail the retention rule")
