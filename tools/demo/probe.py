"""The local Cosmos server's latency while a run goes on, measured from outside.

Once a second a probe makes the two requests the app makes most that depend on the container's size:
a point read and a query scoped to one partition (the parked events of an order, as ``waiting`` reads
them). Its own client goes straight to the server, past the fault proxies, and does not retry, so a
sample is the server's answer time. A server that stops answering shows as a stall: a sample slower
than ``STALLED_SECONDS``, or one that failed.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from azure.core.exceptions import AzureError
from azure.cosmos import CosmosClient
from azure.cosmos.exceptions import CosmosResourceNotFoundError

EVERY_SECONDS = 1.0
STALLED_SECONDS = 10.0
_PARTITION = "latency-probe"  # no document lives there: each request still does the server's lookup work
_WAITING = ("SELECT * FROM c WHERE c.type = 'parked-event' AND c.consumer = @consumer AND c.status = 'parked'",
            [{"name": "@consumer", "value": "orders"}])


@dataclass
class Sample:
    """One probe: when, and each request's milliseconds (None when it failed)."""

    at: float
    read_ms: float | None
    query_ms: float | None
    error: str | None = None


@dataclass
class LatencyProbe:
    """Samples the server's latency on a thread of its own, from ``start`` to ``stop``."""

    endpoint: str
    key: str
    samples: list[Sample] = field(default_factory=list)
    failure: str | None = None  # why the probe itself stopped, if it did
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> LatencyProbe:
        """Begin sampling."""
        self._thread = threading.Thread(target=self._run, name="cosmos-latency-probe", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling (waits for the probe under way)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(3 * STALLED_SECONDS)

    def _run(self) -> None:
        try:
            client = CosmosClient(self.endpoint, credential=self.key, enable_endpoint_discovery=False,
                                  connection_timeout=int(STALLED_SECONDS), read_timeout=int(3 * STALLED_SECONDS),
                                  retry_total=0, retry_connect=0, retry_read=0)
        except Exception as exc:
            self.failure = f"the latency probe could not start: {type(exc).__name__}: {exc}"
            return
        container = client.get_database_client("sales").get_container_client("orders")
        try:
            while not self._stop.wait(EVERY_SECONDS):
                self.samples.append(_sample(container))
        except Exception as exc:
            self.failure = f"the latency probe stopped: {type(exc).__name__}: {exc}"
        finally:
            client.close()

    def figures(self) -> dict[str, Any]:
        """Percentiles of each request's latency over the run, and the stalls."""
        reads = [s.read_ms for s in self.samples if s.read_ms is not None]
        queries = [s.query_ms for s in self.samples if s.query_ms is not None]
        return {"probes": len(self.samples), "failed": sum(1 for s in self.samples if s.error),
                "stalled": len(self.stalls()), "point read ms": _summary(reads),
                "partition query ms": _summary(queries)}

    def stalls(self) -> list[Sample]:
        """The samples that failed or took longer than ``STALLED_SECONDS``."""
        limit = STALLED_SECONDS * 1000
        return [s for s in self.samples if s.error or (s.read_ms or 0) > limit or (s.query_ms or 0) > limit]

    def violations(self) -> list[str]:
        """One line if the server stalled, naming the worst sample; one if the probe itself failed."""
        if self.failure or not self.samples:
            return [self.failure or "the latency probe took no sample: the server's latency was not measured"]
        stalls = self.stalls()
        if not stalls:
            return []
        worst = stalls[0] if stalls[0].error else max(stalls, key=lambda s: max(s.read_ms or 0, s.query_ms or 0))
        detail = worst.error or f"{max(worst.read_ms or 0, worst.query_ms or 0) / 1000:.1f} s"
        return [f"the local Cosmos server stalled: {len(stalls)} of {len(self.samples)} latency probes failed or took"
                f" over {STALLED_SECONDS:g} s (worst: {detail})"]


def _sample(container: Any) -> Sample:
    at = time.time()
    started = time.perf_counter()
    try:
        with contextlib.suppress(CosmosResourceNotFoundError):
            container.read_item(_PARTITION, partition_key=_PARTITION)
        read_ms = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        list(container.query_items(_WAITING[0], parameters=_WAITING[1], partition_key=_PARTITION))
        return Sample(at, read_ms, (time.perf_counter() - started) * 1000)
    except AzureError as exc:
        return Sample(at, None, None, f"{type(exc).__name__} after {time.perf_counter() - started:.1f} s")


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "p99": 0.0, "max": 0.0}
    cuts = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else [values[0]] * 99
    return {"p50": round(cuts[49], 1), "p99": round(cuts[98], 1), "max": round(max(values), 1)}
