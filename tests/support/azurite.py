"""Azurite for tests: a session-scoped fixture, one Azurite (npm, ``tools/devservers/azurite``) per pytest worker.

Register it in a conftest with ``from tests.support.azurite import azurite  # noqa: F401``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devservers.azurite import Azurite, start_azurite

__all__ = ["azurite"]


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    """Azurite on free ports, in memory, for the session; ``.connection_string`` is an ``AzureWebJobsStorage``."""
    with start_azurite() as running:
        yield running
