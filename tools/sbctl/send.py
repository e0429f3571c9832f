"""sbctl send: orders or events, from a JSON Lines file or generated; with duplicates (early or late) and reused ids."""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import MessageSizeExceededError

from sbctl import generate
from sbctl.connection import ToolError

PROGRESS_EVERY = 500


@dataclass(frozen=True)
class Envelope:
    """A message to send: MessageId is the business id; events go to the session of their order."""

    body: dict[str, Any]
    message_id: str
    session_id: str | None = None
    correlation_id: str | None = None
    application_properties: dict[str | bytes, Any] = field(default_factory=dict)

    def to_message(self) -> ServiceBusMessage:
        """The SDK message."""
        return ServiceBusMessage(
            json.dumps(self.body, separators=(",", ":")),
            message_id=self.message_id,
            session_id=self.session_id,
            correlation_id=self.correlation_id,
            content_type="application/json",
            application_properties={k: v for k, v in self.application_properties.items()} or None,
        )


def envelope(record: Any, where: str, correlation_id: str | None = None) -> Envelope:
    """An order body, an event body, or {"body", "correlationId", "applicationProperties"} around either."""
    if not isinstance(record, dict):
        raise ToolError(f"{where}: expected a JSON object")
    properties: dict[str | bytes, Any] = {}
    body = record
    if "body" in record:
        body = record["body"]
        correlation_id = record.get("correlationId", correlation_id)
        properties = record.get("applicationProperties") or {}
        if not isinstance(body, dict) or not isinstance(properties, dict):
            raise ToolError(f"{where}: body and applicationProperties must be JSON objects")
    if "specversion" in body:
        if not isinstance(body.get("id"), str) or not isinstance(body.get("subject"), str):
            raise ToolError(f"{where}: an event needs string id and subject (its orderId)")
        return Envelope(body, body["id"], body["subject"], correlation_id, properties)
    if not isinstance(body.get("orderId"), str):
        raise ToolError(f"{where}: an order needs a string orderId (or an event, a specversion)")
    return Envelope(body, body["orderId"], None, correlation_id, properties)


def read_jsonl(path: Path) -> list[Envelope]:
    """Every envelope of a JSON Lines file, all checked before any is sent; blank lines are skipped.

    The file is UTF-8, with or without a byte order mark; a line that is not names its file and number.
    """
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        reason = "no such file" if isinstance(exc, FileNotFoundError) else exc.strerror or str(exc)
        raise ToolError(f"cannot read {path}: {reason}") from None
    envelopes = []
    for number, raw in enumerate(lines, start=1):
        where = f"{path}:{number}"
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as exc:
            raise ToolError(f"{where}: not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                            "save the file as UTF-8") from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise ToolError(f"{where}: not valid JSON ({reason})") from None
        envelopes.append(envelope(record, where))
    return envelopes


def generated(kind: str, count: int, rng: random.Random, now: datetime | None = None) -> Iterator[Envelope]:
    """``count`` realistic orders, placed in the hour before ``now`` (the clock's, unless given); or, for
    ``events``, the lifecycle events of exactly those orders.

    Each order draws from its own generator, seeded from ``rng``, and its events from another: so
    the same seed makes the same orders for both kinds, and the events of ``events`` belong to the
    orders that ``orders`` places. An order and its events share one trace id (the CorrelationId).
    """
    for _ in range(count):
        order_rng = random.Random(rng.getrandbits(64))  # noqa: S311 - test traffic, reproducible by seed
        events_rng = random.Random(rng.getrandbits(64))  # noqa: S311
        placed = generate.order(order_rng, now)
        trace = f"trace-{order_rng.getrandbits(64):016x}"
        bodies = [placed] if kind == "orders" else generate.order_events(events_rng, placed)
        for body in bodies:
            yield envelope(body, "generated", correlation_id=trace)


def generators(seed: int | None) -> tuple[random.Random, random.Random]:
    """Independent generators for the traffic and for the faults in it.

    Separate, so that --duplicates, --reuse-ids or --late-duplicates never change which orders a
    seed makes.
    """
    if seed is None:
        return random.Random(), random.Random()  # noqa: S311 - test traffic, not security
    return random.Random(f"sbctl-traffic-{seed}"), random.Random(f"sbctl-faults-{seed}")  # noqa: S311


@dataclass
class Summary:
    """What was sent."""

    originals: int = 0
    duplicates: int = 0
    reused: int = 0
    late: int = 0

    @property
    def total(self) -> int:
        return self.originals + self.duplicates + self.reused + self.late

    def add(self, label: str) -> None:
        """Count one message sent under ``label`` (original, duplicate, reused or late)."""
        name = _FIELD[label]
        setattr(self, name, getattr(self, name) + 1)


_FIELD = {"original": "originals", "duplicate": "duplicates", "reused": "reused", "late": "late"}


def with_faults(envelopes: Iterable[Envelope], duplicates: float, reuse_ids: float,
                rng: random.Random, late_duplicates: float = 0.0, *,
                reuse_ids_elsewhere: float = 0.0) -> Iterator[tuple[str, Envelope]]:
    """Each envelope, then maybe an exact copy (a retrying producer), then maybe another payload under its id.

    With ``reuse_ids_elsewhere``, maybe also an event's id and source under another order's subject (and its
    session), its content changed: one key for two orders, labelled ``reused``. With ``late_duplicates``, also
    maybe an exact copy labelled ``late``, which :func:`send` sends only after all the others, when the queue's
    duplicate detection has forgotten the id.
    """
    subjects: list[str] = []
    for item in envelopes:
        yield "original", item
        if rng.random() < duplicates:
            yield "duplicate", item
        if rng.random() < reuse_ids:
            yield "reused", Envelope(generate.altered(rng, item.body), item.message_id, item.session_id,
                                     item.correlation_id, item.application_properties)
        subject = item.body.get("subject")
        others = [s for s in subjects if s != subject]
        if isinstance(subject, str) and others and rng.random() < reuse_ids_elsewhere:
            other = rng.choice(others)
            yield "reused", Envelope(generate.altered(rng, item.body, subject=other), item.message_id,
                                     other if item.session_id is not None else None, item.correlation_id,
                                     item.application_properties)
        if isinstance(subject, str) and subject not in subjects:
            subjects.append(subject)
        if late_duplicates and rng.random() < late_duplicates:
            yield "late", item


def send(client: ServiceBusClient, queue: str, planned: Sequence[tuple[str, Envelope]], *,
         late_after: float = 0.0, progress: TextIO | None = None) -> Summary:
    """Send the plan in batches, in order; the ``late`` copies ``late_after`` seconds after all the rest.

    Progress goes to ``progress`` (default stderr) every few hundred messages, against the plan's total.
    """
    progress = progress or sys.stderr  # looked up per call, so a redirected stderr is honoured
    summary = Summary()
    late = [(label, item) for label, item in planned if label == "late"]
    with client.get_queue_sender(queue) as sender:
        batches = _Batches(sender, summary, len(planned), progress)
        for label, item in planned:
            if label != "late":
                batches.add(label, item)
        batches.flush()
        if late:
            print(f"waiting {late_after:g} s before sending {len(late)} late duplicate(s)", file=progress, flush=True)
            time.sleep(late_after)
            for label, item in late:
                batches.add(label, item)
            batches.flush()
    return summary


class _Batches:
    """Messages sent in batches of one session each, counted, with a progress line every few hundred."""

    def __init__(self, sender: Any, summary: Summary, total: int, progress: TextIO) -> None:
        self._sender = sender
        self._summary = summary
        self._total = total
        self._progress = progress
        self._batch = sender.create_message_batch()
        self._labels: list[str] = []
        self._session: str | None = None

    def add(self, label: str, item: Envelope) -> None:
        message = item.to_message()
        if self._labels and item.session_id != self._session:
            # One session per batch: partitioned entities refuse batches that span partition keys.
            self.flush()
        self._session = item.session_id
        try:
            self._batch.add_message(message)
        except MessageSizeExceededError:  # the batch is full
            self.flush()
            self._batch.add_message(message)
        self._labels.append(label)
        if (self._summary.total + len(self._labels)) % PROGRESS_EVERY == 0:
            self.flush()

    def flush(self) -> None:
        """Send what the batch holds and count it; report progress at every multiple of PROGRESS_EVERY."""
        if not self._labels:
            return
        self._sender.send_messages(self._batch)
        for label in self._labels:
            self._summary.add(label)
        self._batch = self._sender.create_message_batch()
        self._labels = []
        if self._summary.total % PROGRESS_EVERY == 0:
            print(f"sent {self._summary.total}/{self._total} messages", file=self._progress, flush=True)
