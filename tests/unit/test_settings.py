"""Settings are read from the environment; a missing or malformed one names itself."""

from __future__ import annotations

import pytest
from azure.identity import DefaultAzureCredential

from shared.cosmos_store import credential_for
from shared.errors import ConfigurationError
from shared.settings import SETTINGS, CosmosSettings, orders_queue


def test_defaults_apply_when_only_the_endpoint_is_set() -> None:
    settings = CosmosSettings.from_env({"COSMOS_ENDPOINT": "https://acct.documents.azure.com:443/"})
    assert settings == CosmosSettings(
        endpoint="https://acct.documents.azure.com:443/", key=None, verify_tls=True, database="sales",
        container="orders",
    )


def test_missing_endpoint_names_the_setting() -> None:
    with pytest.raises(ConfigurationError, match="COSMOS_ENDPOINT"):
        CosmosSettings.from_env({})


def test_endpoint_must_be_a_url() -> None:
    with pytest.raises(ConfigurationError, match="COSMOS_ENDPOINT"):
        CosmosSettings.from_env({"COSMOS_ENDPOINT": "acct.documents.azure.com"})


@pytest.mark.parametrize(("raw", "expected"), [("false", False), ("FALSE", False), ("0", False), ("true", True)])
def test_verify_tls_parses_booleans(raw: str, expected: bool) -> None:
    env = {"COSMOS_ENDPOINT": "http://127.0.0.1:8081", "COSMOS_VERIFY_TLS": raw}
    assert CosmosSettings.from_env(env).verify_tls is expected


def test_malformed_boolean_names_the_setting() -> None:
    with pytest.raises(ConfigurationError, match="COSMOS_VERIFY_TLS"):
        CosmosSettings.from_env({"COSMOS_ENDPOINT": "http://x", "COSMOS_VERIFY_TLS": "maybe"})


def test_queue_name_has_a_default_and_can_be_overridden() -> None:
    assert orders_queue({}) == "orders"
    assert orders_queue({"ORDERS_QUEUE": "orders-blue"}) == "orders-blue"


def test_setting_names_are_unique() -> None:
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names))


def test_without_a_key_the_cosmos_client_uses_managed_identity() -> None:
    settings = CosmosSettings.from_env({"COSMOS_ENDPOINT": "https://acct.documents.azure.com:443/"})
    assert isinstance(credential_for(settings), DefaultAzureCredential)


def test_with_a_key_the_cosmos_client_uses_the_key() -> None:
    settings = CosmosSettings.from_env({"COSMOS_ENDPOINT": "http://127.0.0.1:8081", "COSMOS_KEY": "k=="})
    assert credential_for(settings) == "k=="
