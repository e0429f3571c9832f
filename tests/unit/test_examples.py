"""The example files the README uses are valid messages for the consumer."""

from __future__ import annotations

import json
from pathlib import Path

from shared.domain.lifecycle import parse_event
from shared.domain.messages import InboundMessage
from shared.domain.orders import parse_order

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_every_example_order_is_valid() -> None:
    for line in (EXAMPLES / "orders.jsonl").read_text().splitlines():
        body = json.loads(line)
        body = body.get("body", body)
        parse_order(InboundMessage(message_id=body["orderId"], body=json.dumps(body).encode()))


def test_every_example_event_is_valid() -> None:
    for line in (EXAMPLES / "events.jsonl").read_text().splitlines():
        body = json.loads(line)
        parse_event(InboundMessage(message_id=body["id"], body=line.encode(), session_id=body["subject"]))
