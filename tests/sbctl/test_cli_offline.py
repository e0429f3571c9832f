"""sbctl without a broker: generated traffic is valid for the consumers, and bad input gets clear errors."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from idempotent_consumer.messages import InboundMessage
from sbctl import generate
from sbctl.cli import main
from sbctl.connection import ToolError
from sbctl.send import Envelope, envelope, generated, read_jsonl, with_faults
from shared.domain.lifecycle import KINDS, CloudEvent, parse_event
from shared.domain.orders import OrderPlaced, parse_order
from tests.devservers.helptext import options_without_help
from tests.devservers.tlsserver import tls_server

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


def test_generated_events_are_the_whole_lifecycles_of_the_orders_the_same_seed_places() -> None:
    orders = list(generated("orders", 30, random.Random(2)))
    events = list(generated("events", 30, random.Random(2)))
    assert {e.session_id for e in events} == {o.message_id for o in orders}
    last: dict[str, int] = {}
    for item in events:
        event = parse_event(inbound(item))
        assert item.message_id == event.id and item.session_id == event.order_id
        assert event.sequence == last.get(event.order_id, 1) + 1
        last[event.order_id] = event.sequence
    assert all(event_type in {"OrderShipped", "OrderCancelled"} for event_type in (
        json.loads(json.dumps(e.body))["type"].rsplit(".", 1)[-1] for e in events
        if last[str(e.session_id)] == e.body["data"]["sequence"]))  # each lifecycle is complete
    trace = {o.message_id: o.correlation_id for o in orders}
    assert all(e.correlation_id == trace[e.session_id] for e in events if e.session_id)


def test_generation_is_reproducible_by_seed() -> None:
    now = datetime(2026, 12, 3, 18, 6, 35, tzinfo=UTC)  # the clock's second could change between the two
    for kind in ("orders", "events"):
        first = [i.body for i in generated(kind, 5, random.Random(7), now)]
        assert first == [i.body for i in generated(kind, 5, random.Random(7), now)]


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


@pytest.mark.parametrize("rate", ["-0.1", "1.5", "nan", "x"])
@pytest.mark.parametrize("option", ["--duplicates", "--late-duplicates", "--reuse-ids"])
def test_rates_must_be_between_zero_and_one(option: str, rate: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["send", "--queue", "q", "--generate", "1", option, rate])
    assert caught.value.code == 2
    assert option in capsys.readouterr().err


@pytest.mark.parametrize("arguments", [
    ["dlq", "list", "--queue", "q", "--max", "-1"], ["dlq", "list", "--queue", "q", "--max", "0"],
    ["send", "--queue", "q", "--generate", "0"], ["send", "--queue", "q", "--generate", "1.5"],
    ["send", "--queue", "q", "--generate", "1", "--late-duplicates", "1", "--after", "-1"],
    ["send", "--queue", "q", "--generate", "1", "--late-duplicates", "1", "--after", "inf"],
    ["send", "--queue", "q", "--generate", "1", "--after", "5"],  # --after without --late-duplicates
    ["dlq", "resubmit", "--queue", "q", "--detection-window", "-PT1M"],
    ["dlq", "resubmit", "--queue", "q", "--detection-window", "ten minutes"],
    ["dlq", "resubmit", "--queue", ""], ["dlq", "purge", "--queue", "q", "--ids"],
])
def test_bad_numbers_and_names_are_bad_usage(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(arguments)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "usage: python -m sbctl" in err and "Traceback" not in err


COMMANDS = [[], ["send"], ["dlq"], ["dlq", "list"], ["dlq", "resubmit"], ["dlq", "purge"], ["parked"],
            ["parked", "list"], ["parked", "release"], ["parked", "drop"], ["index"], ["index", "backfill"],
            ["schemas"]]


def help_text(command: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as caught:
        main([*command, "--help"])
    assert caught.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "sbctl")
def test_every_command_has_help_with_an_example_and_its_exit_statuses(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    text = help_text(command, capsys)
    assert text.startswith("usage: python -m sbctl")
    assert "examples:\n  python -m sbctl " + " ".join(command) in text
    statuses = " ".join(text.split("exit status", 1)[-1].split())
    assert statuses.startswith((": 0 ", "(the same for every command): 0 ")) and "2 bad usage" in statuses
    assert options_without_help(text) == []


def test_the_exit_statuses_are_the_same_for_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    top = help_text([], capsys)
    for status in ("0 done", "1 failed", "2 bad usage", "3 nothing matched", "4 held back", "130 interrupted"):
        assert status in " ".join(top.split())
    assert "3 nothing matched" in help_text(["dlq", "purge"], capsys)
    assert "4 some held back" in help_text(["dlq", "resubmit"], capsys)


def test_the_module_entry_point_prints_help() -> None:
    run = subprocess.run([sys.executable, "-m", "sbctl", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=False)
    assert run.returncode == 0 and "usage: python -m sbctl" in run.stdout


def test_a_file_that_is_not_utf8_is_one_line_naming_the_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "latin1.jsonl"
    order = generate.order(random.Random(10))
    path.write_bytes(json.dumps(order).encode() + b"\n" + json.dumps({**order, "customerId": "Jos\u00e9"})
                     .encode().replace(b"\\u00e9", b"\xe9") + b"\n")
    assert main(["send", "--queue", "q", "--file", str(path), "--connection-string", "x"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{path}:2: not UTF-8 (byte 0xe9" in err


def test_a_utf8_file_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    order = generate.order(random.Random(11))
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(order).encode() + b"\r\n" + json.dumps(order).encode() + b"\n")
    assert [e.message_id for e in read_jsonl(path)] == [order["orderId"]] * 2


def test_plain_amqp_to_a_tls_endpoint_is_one_line_naming_the_emulator_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with tls_server() as port:
        conn = f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true"
        assert main(["dlq", "list", "--queue", "q", "--connection-string", conn]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"at 127.0.0.1:{port} (plain AMQP)" in err and "drop UseDevelopmentEmulator=true" in err


def test_schemas_that_cannot_be_written_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["schemas", "--out", str(blocker / "schemas")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"sbctl: error: cannot write the schemas to {blocker / 'schemas'}: ") and err.count("\n") == 1


def test_an_event_id_reused_elsewhere_goes_to_another_orders_subject_and_session_with_the_same_id_and_source() -> None:
    base = list(generated("events", 30, random.Random(8)))
    planned = list(with_faults(base, duplicates=0.0, reuse_ids=0.0, rng=random.Random(9), reuse_ids_elsewhere=0.5))
    moved = [(previous, item) for (label, item), (_, previous) in zip(planned[1:], planned, strict=False)
             if label == "reused"]
    assert len(moved) > 5
    subjects = {item.body["subject"] for item in base}
    for original, item in moved:
        assert (item.message_id, item.body["id"], item.body["source"]) == (
            original.message_id, original.body["id"], original.body["source"])
        assert item.body["subject"] != original.body["subject"] and item.body["subject"] in subjects
        assert item.session_id == item.body["subject"] and item.body["data"] != original.body["data"]
