"""sbctl send: orders or events from a JSON Lines file, or generated; with duplicates and reused ids."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import MessageSizeExceededError

from sbctl import generate
from sbctl.connection import ToolError, translated

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


def read_jsonl(path: Path) -> Iterator[Envelope]:
    """Envelopes from a JSON Lines file; blank lines are skipped; a bad line names itself."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise ToolError(f"cannot read {path}: {exc.strerror}") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
                raise ToolError(f"{path}:{number}: not valid JSON ({reason})") from None
            yield envelope(record, f"{path}:{number}")


def generated(kind: str, count: int, rng: random.Random) -> Iterator[Envelope]:
    """``count`` realistic orders, or ``count`` events (whole lifecycles, in order, per order)."""
    made = 0
    while made < count:
        placed = generate.order(rng)
        trace = f"trace-{rng.getrandbits(64):016x}"
        bodies = [placed] if kind == "orders" else generate.order_events(rng, placed)
        for body in bodies[: count - made]:
            yield envelope(body, "generated", correlation_id=trace)
            made += 1


@dataclass
class Summary:
    """What was sent."""

    originals: int = 0
    duplicates: int = 0
    reused: int = 0

    @property
    def total(self) -> int:
        return self.originals + self.duplicates + self.reused


def with_faults(envelopes: Iterable[Envelope], duplicates: float, reuse_ids: float,
                rng: random.Random) -> Iterator[tuple[str, Envelope]]:
    """Each envelope, then maybe an exact copy (a retrying producer), then maybe another payload under its id."""
    for item in envelopes:
        yield "original", item
        if rng.random() < duplicates:
            yield "duplicate", item
        if rng.random() < reuse_ids:
            yield "reused", Envelope(generate.altered(rng, item.body), item.message_id, item.session_id,
                                     item.correlation_id, item.application_properties)


def send(client: ServiceBusClient, queue: str, planned: Iterable[tuple[str, Envelope]], expected: int | None,
         progress: TextIO | None = None) -> Summary:
    """Send in batches, in order; report progress on stderr every few hundred messages."""
    progress = progress or sys.stderr  # looked up per call, so a redirected stderr is honoured
    summary = Summary()
    with translated(queue), client.get_queue_sender(queue) as sender:
        batch = sender.create_message_batch()
        session: str | None = None
        for label, item in planned:
            message = item.to_message()
            if len(batch) and item.session_id != session:
                # One session per batch: partitioned entities refuse batches that span partition keys.
                sender.send_messages(batch)
                batch = sender.create_message_batch()
            session = item.session_id
            try:
                batch.add_message(message)
            except MessageSizeExceededError:  # the batch is full
                sender.send_messages(batch)
                batch = sender.create_message_batch()
                batch.add_message(message)
            setattr(summary, _FIELD[label], getattr(summary, _FIELD[label]) + 1)
            if summary.total % PROGRESS_EVERY == 0:
                sender.send_messages(batch)
                batch = sender.create_message_batch()
                of = f"/{expected}" if expected else ""
                print(f"sent {summary.total}{of} messages", file=progress, flush=True)
        if len(batch):
            sender.send_messages(batch)
    return summary


_FIELD = {"original": "originals", "duplicate": "duplicates", "reused": "reused"}
