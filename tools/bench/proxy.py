"""Whether to read proxy settings from the environment on every request, decided by measurement.

aiohttp (like requests before it) looks up ``*_PROXY``, ``NO_PROXY`` and ``.netrc`` for every request
its session sends, unless ``trust_env`` is off (azure-core: ``use_env_settings``). The cost grows with the size of
the environment, and a Functions worker's holds well over a hundred variables. This runs the
project's full order path (with the fulfilment stand-in) at concurrency 1, with the environment
padded to ``ENVIRONMENT_SIZE`` variables, with the look-up on and off, alternating.
"""

from __future__ import annotations

import asyncio
import os
import statistics
from typing import Any

import msgspec

from bench import throughput
from bench.wire import CountingTransport
from idempotent_consumer.adapters.cosmos import make_client
from shared.settings import Settings

ENVIRONMENT_SIZE = 136  # about what a Functions worker sees
ROUNDS = 3


def measure(settings: Settings, fulfilment_url: str, seed: int, messages: int = 1000) -> dict[str, Any]:
    """Median messages/s with the look-up on and off, and their ratio."""
    padding = {f"APPSETTING_BENCH_PADDING_{n}": "x" * 40 for n in range(max(0, ENVIRONMENT_SIZE - len(os.environ)))}
    os.environ.update(padding)
    speeds: dict[bool, list[float]] = {True: [], False: []}
    try:
        for turn in range(ROUNDS):
            for on in ((True, False) if turn % 2 == 0 else (False, True)):
                flagged = msgspec.structs.replace(settings, http_proxy_from_environment=on)
                work = throughput.workload(throughput.NEW, messages, seed)
                speeds[on].append(asyncio.run(_speed(flagged, fulfilment_url, work)))
    finally:
        for name in padding:
            os.environ.pop(name, None)
    on_speed, off_speed = statistics.median(speeds[True]), statistics.median(speeds[False])
    return {"environment variables": ENVIRONMENT_SIZE, "on messages/s": round(on_speed, 1),
            "off messages/s": round(off_speed, 1), "off / on": round(off_speed / on_speed, 3)}


async def _speed(settings: Settings, fulfilment_url: str, work: throughput.Workload) -> float:
    """Messages/s of the full order path at c1, with the look-up as ``settings`` says."""
    transport = CountingTransport(use_env_settings=settings.http_proxy_from_environment)
    async with make_client(settings, transport=transport) as client:
        bench = throughput.Bench(client, transport, settings, settings.cosmos_database, fulfilment_url)
        return (await bench.run_cell(throughput.PROJECT_STANDIN, work, 1)).per_second
