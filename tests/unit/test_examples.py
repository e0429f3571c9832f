"""The example files the docs use (``sbctl send --file``) are there, and are valid messages for the consumer."""

from __future__ import annotations

import json
from pathlib import Path

from idempotent_consumer.messages import InboundMessage
from shared.domain.lifecycle import KINDS, parse_event
from shared.domain.orders import parse_order

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# A loop over the lines of an emptied or truncated file passes; each file holds four today.
MIN_EXAMPLES = 3


def examples(name: str) -> list[str]:
    lines = (EXAMPLES / name).read_text().splitlines()
    assert len(lines) >= MIN_EXAMPLES, f"examples/{name} holds {len(lines)} examples, fewer than {MIN_EXAMPLES}"
    return lines


def test_every_example_order_is_valid() -> None:
    for line in examples("orders.jsonl"):
        body = json.loads(line)
        body = body.get("body", body)
        parse_order(InboundMessage(message_id=body["orderId"], body=json.dumps(body).encode()))


def test_every_example_event_is_valid_and_every_event_type_has_one() -> None:
    types = set()
    for line in examples("events.jsonl"):
        body = json.loads(line)
        types.add(parse_event(InboundMessage(message_id=body["id"], body=line.encode(),
                                             session_id=body["subject"])).type)
    assert types == set(KINDS)
