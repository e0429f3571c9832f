"""App settings: one frozen object read from the environment, and the list of every setting read.

``SETTINGS`` is the single source for the names: the README table, ``local.settings.sample.json``
and the infrastructure checks are tested against it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from shared.errors import ConfigurationError


@dataclass(frozen=True)
class SettingSpec:
    """One app setting: its name, default (None = required or optional without default) and purpose."""

    name: str
    default: str | None
    description: str
    required: bool = False


ORDERS_QUEUE = SettingSpec("ORDERS_QUEUE", "orders", "Queue that process_order listens on.")
COSMOS_ENDPOINT = SettingSpec("COSMOS_ENDPOINT", None, "Cosmos DB account endpoint URL.", required=True)
COSMOS_KEY = SettingSpec(
    "COSMOS_KEY", None, "Account key, for local emulators only. Unset: DefaultAzureCredential (managed identity)."
)
COSMOS_VERIFY_TLS = SettingSpec(
    "COSMOS_VERIFY_TLS", "true", "Verify the Cosmos endpoint's TLS certificate; false only for local emulators."
)
COSMOS_DATABASE = SettingSpec("COSMOS_DATABASE", "sales", "Cosmos DB database name.")
COSMOS_CONTAINER = SettingSpec("COSMOS_CONTAINER", "orders", "Container of orders, partitioned by /orderId.")

SETTINGS: tuple[SettingSpec, ...] = (
    ORDERS_QUEUE,
    COSMOS_ENDPOINT,
    COSMOS_KEY,
    COSMOS_VERIFY_TLS,
    COSMOS_DATABASE,
    COSMOS_CONTAINER,
)

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


def read_setting(spec: SettingSpec, env: Mapping[str, str] | None = None) -> str | None:
    """Return the setting's value, its default, or raise ConfigurationError if it is required."""
    source = os.environ if env is None else env
    value = source.get(spec.name, "").strip()
    if value:
        return value
    if spec.required:
        raise ConfigurationError(spec.name, "is required but not set")
    return spec.default


def _read_bool(spec: SettingSpec, env: Mapping[str, str] | None) -> bool:
    value = (read_setting(spec, env) or "").lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigurationError(spec.name, f"must be true or false, not {value!r}")


def _read_name(spec: SettingSpec, env: Mapping[str, str] | None) -> str:
    value = read_setting(spec, env)
    if value is None:  # pragma: no cover - every name setting has a default
        raise ConfigurationError(spec.name, "is required but not set")
    return value


@dataclass(frozen=True)
class CosmosSettings:
    """Where and how to reach the orders container."""

    endpoint: str
    key: str | None
    verify_tls: bool
    database: str
    container: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CosmosSettings:
        """Read the Cosmos settings; a missing required one raises ConfigurationError naming it."""
        endpoint = _read_name(COSMOS_ENDPOINT, env)
        if not endpoint.startswith(("https://", "http://")):
            raise ConfigurationError(COSMOS_ENDPOINT.name, "must be an http(s) URL")
        return cls(
            endpoint=endpoint,
            key=read_setting(COSMOS_KEY, env),
            verify_tls=_read_bool(COSMOS_VERIFY_TLS, env),
            database=_read_name(COSMOS_DATABASE, env),
            container=_read_name(COSMOS_CONTAINER, env),
        )


def orders_queue(env: Mapping[str, str] | None = None) -> str:
    """The queue process_order is bound to, read when the function is indexed."""
    return _read_name(ORDERS_QUEUE, env)
