"""Settings are declared once and read from the environment; a missing or malformed one names itself."""

from __future__ import annotations

import asyncio
import re

import msgspec
import pytest
from azure.identity.aio import DefaultAzureCredential

from idempotent_consumer.adapters.cosmos import CosmosStore, credential_for
from idempotent_consumer.adapters.servicebus import ServiceBusSender
from idempotent_consumer.errors import ConfigurationError
from shared.settings import SETTINGS, Settings


def test_defaults_apply_when_nothing_is_set() -> None:
    settings = Settings.from_env({"COSMOS_ENDPOINT": "https://acct.documents.azure.com:443/"})
    assert (settings.cosmos_endpoint, settings.cosmos_key, settings.cosmos_verify_tls) == (
        "https://acct.documents.azure.com:443/", None, True)
    assert (settings.cosmos_database, settings.cosmos_container, settings.orders_queue) == ("sales", "orders", "orders")


def test_a_required_setting_is_named_where_it_is_needed() -> None:
    with pytest.raises(ConfigurationError, match="COSMOS_ENDPOINT: is required"):
        Settings.from_env({}).need("cosmos_endpoint")


@pytest.mark.parametrize("name", ["COSMOS_ENDPOINT", "FULFILLMENT_URL"])
def test_endpoints_must_be_urls(name: str) -> None:
    with pytest.raises(ConfigurationError, match=name):
        Settings.from_env({name: "acct.documents.azure.com"})


@pytest.mark.parametrize(("raw", "expected"), [("false", False), ("FALSE", False), ("0", False), ("true", True)])
def test_booleans_parse_in_lax_mode(raw: str, expected: bool) -> None:
    assert Settings.from_env({"COSMOS_VERIFY_TLS": raw}).cosmos_verify_tls is expected


@pytest.mark.parametrize(("name", "raw"), [("COSMOS_VERIFY_TLS", "maybe"), ("SIDE_EFFECT_LEASE_SECONDS", "0"),
                                          ("FULFILLMENT_READ_TIMEOUT_SECONDS", "ten")])
def test_malformed_value_gives_one_error_naming_the_setting(name: str, raw: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({"COSMOS_ENDPOINT": "http://x", name: raw})
    assert caught.value.setting == name


def test_an_empty_value_counts_as_unset() -> None:
    assert Settings.from_env({"ORDERS_QUEUE": "  "}).orders_queue == "orders"


def test_queue_name_can_be_overridden() -> None:
    assert Settings.from_env({"ORDERS_QUEUE": "orders-blue"}).orders_queue == "orders-blue"


def test_every_field_is_declared_once_with_a_description() -> None:
    names = [f.encode_name for f in msgspec.structs.fields(Settings)]
    assert names == list(SETTINGS)
    assert all(spec.description for spec in SETTINGS.values())


def test_declared_defaults_are_the_fields_defaults() -> None:
    for field in msgspec.structs.fields(Settings):
        assert SETTINGS[field.encode_name].default == field.default, field.encode_name


def test_without_a_key_the_cosmos_client_uses_managed_identity(loop: asyncio.Runner) -> None:
    settings = Settings.from_env({"COSMOS_ENDPOINT": "https://acct.documents.azure.com:443/"})
    credential = credential_for(settings)
    assert isinstance(credential, DefaultAzureCredential)  # the async one, as azure.cosmos.aio needs
    loop.run(credential.close())


def test_with_a_key_the_cosmos_client_uses_the_key() -> None:
    settings = Settings.from_env({"COSMOS_ENDPOINT": "http://127.0.0.1:8081", "COSMOS_KEY": "k=="})
    assert credential_for(settings) == "k=="


def _count_credential_closes(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Record each DefaultAzureCredential closed (the SDK clients never close the credential they are given)."""
    closed: list[object] = []
    original = DefaultAzureCredential.close

    async def close(self: DefaultAzureCredential) -> None:
        closed.append(self)
        await original(self)

    monkeypatch.setattr(DefaultAzureCredential, "close", close)
    return closed


def test_a_store_on_managed_identity_closes_its_credential_with_its_client(
    loop: asyncio.Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = _count_credential_closes(monkeypatch)
    store = CosmosStore.from_settings(Settings.from_env({"COSMOS_ENDPOINT": "https://acct.documents.azure.com:443/"}))
    loop.run(store.close())
    assert len(closed) == 1
    loop.run(store.close())  # closing again closes nothing twice
    assert len(closed) == 1


def test_a_sender_on_managed_identity_closes_its_credential_with_its_client(
    loop: asyncio.Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = _count_credential_closes(monkeypatch)
    settings = Settings.from_env({"ServiceBusConnection__fullyQualifiedNamespace": "ns.servicebus.windows.net"})
    loop.run(ServiceBusSender.from_settings(settings).close())
    assert len(closed) == 1


def test_every_malformed_value_is_named_in_one_error() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({"COSMOS_VERIFY_TLS": "maybe", "SIDE_EFFECT_LEASE_SECONDS": "0", "ORDERS_QUEUE": "ok",
                           "FULFILLMENT_URL": "no-scheme"})
    named = [setting for setting, _ in caught.value.problems]
    assert sorted(named) == ["COSMOS_VERIFY_TLS", "FULFILLMENT_URL", "SIDE_EFFECT_LEASE_SECONDS"]
    assert str(caught.value).startswith("3 settings: ") and all(name in str(caught.value) for name in named)


def test_a_consumers_settings_are_read_under_its_prefix_and_the_accounts_without() -> None:
    env = {"PAYMENTS_ORDERS_QUEUE": "payments", "ORDERS_QUEUE": "orders-of-another", "PAYMENTS_DEDUP_TTL_SECONDS":
           "900000", "COSMOS_ENDPOINT": "https://acct.documents.azure.com:443/", "PAYMENTS_COSMOS_ENDPOINT": "x",
           "ServiceBusConnection__fullyQualifiedNamespace": "ns.servicebus.windows.net"}
    settings = Settings.from_env(env, prefix="PAYMENTS_")
    assert (settings.orders_queue, settings.dedup_ttl_seconds) == ("payments", 900000)
    assert settings.cosmos_endpoint == "https://acct.documents.azure.com:443/"  # the account's: unprefixed
    assert settings.servicebus_namespace == "ns.servicebus.windows.net"
    assert Settings.from_env(env).orders_queue == "orders-of-another"


def test_a_malformed_prefixed_value_is_named_as_the_environment_spells_it() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({"PAYMENTS_RETRY_IN_LOCK_ATTEMPTS": "0", "COSMOS_VERIFY_TLS": "maybe"}, prefix="PAYMENTS_")
    assert sorted(s for s, _ in caught.value.problems) == ["COSMOS_VERIFY_TLS", "PAYMENTS_RETRY_IN_LOCK_ATTEMPTS"]


def test_the_app_built_names_every_required_setting_missing_at_once() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({"COSMOS_KEY": "k=="}).complete("PAYMENTS_")
    assert [s for s, _ in caught.value.problems] == [
        "COSMOS_ENDPOINT", "PAYMENTS_FULFILLMENT_URL", "ServiceBusConnection__fullyQualifiedNamespace"]
    complete = Settings.from_env({"COSMOS_ENDPOINT": "http://127.0.0.1:8081", "FULFILLMENT_URL": "http://f",
                                  "ServiceBusConnection": "Endpoint=sb://localhost/;SharedAccessKeyName=k;"
                                  "SharedAccessKey=v"})
    assert complete.complete() is complete


def test_the_function_apps_first_port_names_every_required_setting_missing_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from shared import bootstrap  # noqa: PLC0415 - the app's root, imported by this test only

    for name in ("COSMOS_ENDPOINT", "FULFILLMENT_URL", "ServiceBusConnection",
                 "ServiceBusConnection__fullyQualifiedNamespace"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("APPLICATIONINSIGHTS_CONNECTION_STRING", raising=False)
    app = bootstrap.from_environment()
    for port in (app.store, app.fulfilment, app.sender):
        with pytest.raises(ConfigurationError, match="3 settings: COSMOS_ENDPOINT: is required but not set"):
            port()


def test_the_operations_guide_lists_the_accounts_settings_as_declared() -> None:
    from pathlib import Path  # noqa: PLC0415

    guide = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    paragraph = guide[guide.index("The settings are a consumer's."):].split("\n\n")[0]
    listed = set(re.findall(r"`([A-Za-z_]+)`", paragraph[paragraph.index("read unprefixed:"):]))
    assert listed == {name for name, spec in SETTINGS.items() if spec.account}
