"""The operator after a rollback: this release's ``sbctl`` maps back the copies the release before dead-lettered.

A delayed retry's copy that comes due on a host of the release before (``versions.PREVIOUS``) is dead-lettered
``InvalidMessage``: that release knows no copy. What an operator does then (docs/operations.md, "Before a
rollback") is ``sbctl dlq resubmit --reason InvalidMessage --copies``, which sends each back under its original
MessageId, without its chain's properties. This runs the same code, every few seconds while the run drains, so
that the drain, which waits for every order's reservation, sees those messages processed.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections import Counter
from datetime import timedelta

from azure.servicebus import ServiceBusClient
from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusConnectionError

from idempotent_consumer.migrations import set_due
from sbctl import dlq
from sbctl.detection import Detection
from shared import bootstrap
from shared.settings import Settings

EVERY_SECONDS = 5.0
FINAL_ATTEMPTS = 4
SELECTION = dlq.Selection(reason="InvalidMessage", copies=True)


class MapBack:
    """Resubmit the copies dead-lettered InvalidMessage on ``queues``, every EVERY_SECONDS until ``stop``."""

    def __init__(self, connection_string: str, queues: tuple[str, ...], detection_window_seconds: float) -> None:
        self._client = ServiceBusClient.from_connection_string(connection_string)
        self._queues = queues
        self._detection = Detection(timedelta(seconds=detection_window_seconds), "the stack's queues")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.resubmitted: Counter[str] = Counter()  # by queue
        # Every resubmission sent, by queue: one whose dead letter could not be removed after (its lock lost) is sent
        # again by a later pass, and the broker numbers both.
        self.sent: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._last_sent = 0.0  # when a pass last resubmitted (under the original MessageId)
        self._quiet_from: float | None = None  # passes begun from then on are watched for a quiet one
        self._quiet = False  # a watched pass held nothing and found nothing left to resubmit
        self._found = False  # a pass found a copy in a dead-letter queue, resubmitted or held

    def start(self) -> None:
        """Map back in the background."""
        self._thread = threading.Thread(target=self._loop, name="chaos-map-back", daemon=True)
        self._thread.start()

    def stop(self) -> int:
        """Stop the background passes, then make one more: how many that last pass resubmitted. A last pass the local
        broker did not answer in time is made again, up to FINAL_ATTEMPTS times in all (a loaded 2-core machine's
        broker has refused connections past the SDK's retries while the hosts drained on); past that, it raises."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            for attempt in range(1, FINAL_ATTEMPTS + 1):
                try:
                    return self.once()
                except (ServiceBusConnectionError, OperationTimeoutError) as exc:
                    if attempt == FINAL_ATTEMPTS:
                        raise
                    print(f"chaos: the last map-back pass failed ({type(exc).__name__}); trying again", flush=True)
                    time.sleep(EVERY_SECONDS)
            return 0  # not reached: the last attempt returned or raised
        finally:
            self._client.close()

    def once(self) -> int:
        """One pass over every queue: how many copies it resubmitted (those the detection window still holds wait
        for the next pass)."""
        begun, done, held = time.time(), 0, 0
        for queue in self._queues:
            passed = dlq.resubmit(self._client, queue, SELECTION, self._detection, report=lambda _: None,
                                  report_held=lambda _: None, on_sent=functools.partial(self._sent, queue))
            self.resubmitted[queue] += len(passed.resubmitted)
            done, held = done + len(passed.resubmitted), held + len(passed.held)
            self._found = self._found or bool(passed.resubmitted or passed.held)
        with self._lock:
            if done:
                self._last_sent = time.time()
            if self._quiet_from is not None and begun >= self._quiet_from and not done and not held:
                self._quiet = True
        return done

    def _sent(self, queue: str, _: object) -> None:
        with self._lock:
            self.sent[queue] += 1

    def found(self) -> bool:
        """Whether a pass has found a copy to map back yet (resubmitted, or held for the detection window)."""
        return self._found

    def watch_for_quiet(self) -> None:
        """From now on (the release before is gone, so nothing more is dead-lettered for this to map back),
        watch for a pass that finds nothing to resubmit."""
        with self._lock:
            self._quiet_from, self._quiet = time.time(), False

    def last_sent(self) -> float | None:
        """When this last resubmitted under an original MessageId, once a pass begun after ``watch_for_quiet``
        found nothing left to resubmit; None until then."""
        with self._lock:
            return self._last_sent if self._quiet else None

    def _loop(self) -> None:
        while not self._stop.wait(EVERY_SECONDS):
            try:
                self.once()
            except Exception as exc:  # an operator's pass that failed is made again at the next: one line, on
                print(f"chaos: mapping back failed ({type(exc).__name__}: {str(exc)[:120]}); trying again",
                      flush=True)


def backfill(endpoint: str, key: str) -> dict[str, int]:
    """Once the rollback is over, what an operator does for the records the release before wrote without ``due``
    (docs/operations.md, "Indexing"): ``sbctl index backfill``'s own work (``migrations.set_due``, through the store
    the app builds) on the orders container. What it did, by kind and outcome (``outbox set``, ...)."""

    async def run() -> dict[str, int]:
        app = bootstrap.build(Settings(cosmos_endpoint=endpoint, cosmos_key=key,
                                       cosmos_verify_tls=not endpoint.startswith("https://127.")))
        try:
            return dict(await set_due(app.store()))
        finally:
            await app.aclose()

    return asyncio.run(run())
