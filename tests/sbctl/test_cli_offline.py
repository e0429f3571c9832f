"""sbctl without a broker: generated traffic is valid for the consumers, and bad input gets clear errors."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sbctl import generate
from sbctl.cli import main
from sbctl.connection import ToolError
from sbctl.send import Envelope, envelope, generated, read_jsonl, with_faults
from shared.domain.lifecycle import KINDS, CloudEvent, parse_event
from shared.domain.messages import InboundMessage
from shared.domain.orders import OrderPlaced, parse_order

ROOT = Path(__file__).resolve().parents[2]


def inbound(item: Envelope) -> InboundMessage:
    return InboundMessage(message_id=item.message_id, body=json.dumps(item.body).encode(), session_id=item.session_id)


def parsed(body: dict[str, Any]) -> OrderPlaced | CloudEvent:
    """The body as the consumers parse it: events carry a SessionId, orders do not."""
    item = envelope(body, "test")
    return parse_event(inbound(item)) if item.session_id else parse_order(inbound(item))


def lifecycles(seed: int, orders: int) -> list[dict[str, Any]]:
    """Generated orders, each followed by its events."""
    rng = random.Random(seed)
    bodies: list[dict[str, Any]] = []
    for _ in range(orders):
        placed = generate.order(rng)
        bodies += [placed, *generate.order_events(rng, placed)]
    return bodies


def test_generated_orders_pass_the_consumers_validation() -> None:
    for item in generated("orders", 50, random.Random(1)):
        order = parse_order(inbound(item))
        assert item.message_id == order.order_id and item.session_id is None
        assert item.correlation_id and item.correlation_id.startswith("trace-")


def test_generated_events_are_valid_in_order_per_session() -> None:
    items = list(generated("events", 60, random.Random(2)))
    assert len(items) == 60
    last: dict[str, int] = {}
    for item in items:
        event = parse_event(inbound(item))
        assert item.message_id == event.id and item.session_id == event.order_id
        assert event.sequence == last.get(event.order_id, 1) + 1
        last[event.order_id] = event.sequence


def test_generation_is_reproducible_by_seed() -> None:
    for kind in ("orders", "events"):
        first = [i.body for i in generated(kind, 5, random.Random(7))]
        assert first == [i.body for i in generated(kind, 5, random.Random(7))]


def test_every_generated_message_is_exactly_its_model_and_parses() -> None:
    bodies = lifecycles(8, 100)
    for body in bodies:
        message = parsed(body)
        assert msgspec.json.decode(msgspec.json.encode(message), type=type(message)) == message
        assert msgspec.to_builtins(message) == body
    assert {b["type"] for b in bodies if "type" in b} == set(KINDS)


def test_reused_ids_keep_the_identity_and_change_the_request_hash() -> None:
    rng = random.Random(3)
    for body in lifecycles(9, 30):
        changed = generate.altered(rng, body)
        before, after = envelope(body, "test"), envelope(changed, "test")
        assert (after.message_id, after.session_id) == (before.message_id, before.session_id)
        assert parsed(changed).request_hash() != parsed(body).request_hash()


@pytest.mark.parametrize(
    ("body", "error"),
    [({"orderId": "o"}, "cannot reuse the id of an invalid message: Object missing required field"),
     ({"specversion": "1.0", "id": "e", "subject": "o", "type": "x"}, "event of unknown type 'x'")],
)
def test_reusing_the_id_of_a_message_outside_the_model_is_a_clear_error(body: dict[str, Any], error: str) -> None:
    with pytest.raises(ToolError, match=error):
        generate.altered(random.Random(0), body)


def test_faults_add_copies_and_reused_ids_at_the_given_rates() -> None:
    base = list(generated("orders", 200, random.Random(4)))
    planned = list(with_faults(base, duplicates=0.5, reuse_ids=0.25, rng=random.Random(5)))
    labels = [label for label, _ in planned]
    assert labels.count("original") == 200
    assert 60 < labels.count("duplicate") < 140 and 20 < labels.count("reused") < 80
    for (label, item), (_, previous) in zip(planned[1:], planned, strict=False):
        if label == "duplicate":
            assert item == previous


def test_envelope_takes_correlation_and_properties(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    order = generate.order(random.Random(6))
    path.write_text(json.dumps({"body": order, "correlationId": "c-1", "applicationProperties": {"k": "v"}}) + "\n\n")
    [item] = list(read_jsonl(path))
    assert (item.message_id, item.correlation_id, item.application_properties) == (order["orderId"], "c-1", {"k": "v"})


@pytest.mark.parametrize(
    ("line", "error"),
    [("{not json", "in.jsonl:1: not valid JSON"), ("[1]", "expected a JSON object"),
     ('{"customerId": "c"}', "an order needs a string orderId"),
     ('{"specversion": "1.0", "id": "e"}', "an event needs string id and subject")],
)
def test_bad_file_lines_are_named(tmp_path: Path, line: str, error: str) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ToolError, match=error):
        list(read_jsonl(path))


def test_missing_file_is_a_clear_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["send", "--queue", "q", "--file", str(tmp_path / "nope.jsonl"), "--connection-string", "x"])
    assert code == 1
    assert "no such file" in capsys.readouterr().err


def test_no_connection_is_a_clear_error(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVICEBUS_CONNECTION_STRING", raising=False)
    assert main(["dlq", "list", "--queue", "orders"]) == 1
    assert "--connection-string" in capsys.readouterr().err


def test_bad_connection_string_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dlq", "list", "--queue", "orders", "--connection-string", "not a connection string"]) == 1
    assert "bad connection string" in capsys.readouterr().err


@pytest.mark.parametrize("rate", ["-0.1", "1.5"])
def test_rates_must_be_between_zero_and_one(rate: str) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["send", "--queue", "q", "--generate", "1", "--duplicates", rate])
    assert caught.value.code == 2


@pytest.mark.parametrize(
    "command", [[], ["send"], ["dlq"], ["dlq", "list"], ["dlq", "resubmit"], ["dlq", "purge"]]
)
def test_every_command_has_help(command: list[str]) -> None:
    run = subprocess.run([sys.executable, "-m", "sbctl", *command, "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 0
    assert "usage: python -m sbctl" in run.stdout
