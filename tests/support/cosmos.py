"""Cosmos DB for tests: a session-scoped endpoint fixture and a client factory.

Register the fixture in a conftest with ``from tests.support.cosmos import cosmos_endpoint  # noqa: F401``.

By default the fixture starts the local server (``devservers.cosmos``; needs
``npm ci --prefix tools/devservers/cosmos``) on a free port for the whole session. To run the same tests
against another Cosmos (e.g. the real emulator) set:

* ``COSMOS_TEST_ENDPOINT``: its URL, e.g. ``https://localhost:8081``;
* ``COSMOS_TEST_KEY``: its key (default: the emulator's well-known key);
* ``COSMOS_TEST_VERIFY_TLS``: ``1``/``true`` to verify its certificate (default: don't).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from azure.cosmos import CosmosClient

from devservers.cosmos import EMULATOR_KEY, start_cosmos_server

__all__ = ["CosmosEndpoint", "cosmos_endpoint", "make_cosmos_client"]


@dataclass(frozen=True)
class CosmosEndpoint:
    url: str
    key: str = EMULATOR_KEY
    verify_tls: bool = False
    #: True when the fixture started the local server (rather than using COSMOS_TEST_ENDPOINT).
    local: bool = True


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


@pytest.fixture(scope="session")
def cosmos_endpoint() -> Iterator[CosmosEndpoint]:
    """The Cosmos endpoint tests use: COSMOS_TEST_ENDPOINT if set, else a local server for the session."""
    url = os.environ.get("COSMOS_TEST_ENDPOINT", "").strip()
    if url:
        yield CosmosEndpoint(
            url=url,
            key=os.environ.get("COSMOS_TEST_KEY") or EMULATOR_KEY,
            verify_tls=_env_flag("COSMOS_TEST_VERIFY_TLS", default=False),
            local=False,
        )
        return
    with start_cosmos_server() as server:
        yield CosmosEndpoint(url=server.endpoint)


def make_cosmos_client(endpoint_info: CosmosEndpoint, **options: Any) -> CosmosClient:
    """A CosmosClient for the endpoint; extra keyword options go to the client.

    Over plain HTTP endpoint discovery is turned off: the account document the server returns
    advertises an https:// address that nothing listens on.
    """
    settings: dict[str, Any] = {"connection_verify": endpoint_info.verify_tls}
    if endpoint_info.url.lower().startswith("http://"):
        settings["enable_endpoint_discovery"] = False
    settings.update(options)
    return CosmosClient(endpoint_info.url, credential=endpoint_info.key, **settings)
