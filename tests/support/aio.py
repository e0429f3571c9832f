"""One event loop for the test session, as the Functions worker has one for every invocation.

The app's clients (``azure.cosmos.aio``, aiohttp, ``azure.servicebus.aio``) bind to the loop they
first run in, so tests that reach them run every coroutine on the session's ``loop`` fixture:
``loop.run(coro)``. Tests on the in-memory fakes, which hold nothing across calls, may use
``asyncio.run``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def loop() -> Iterator[asyncio.Runner]:
    """The session's event loop runner."""
    with asyncio.Runner() as runner:
        yield runner
