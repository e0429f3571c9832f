"""sbctl against the local broker with the real azure-servicebus SDK: send, dlq list/resubmit/purge."""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage

from devservers.servicebus import Broker, connection_string, start_broker
from sbctl.cli import main
from tests.sbctl.queues import config, dead_letter, drain, queue

ROOT = Path(__file__).resolve().parents[2]


CONFIG = config(
    queue("plain"), queue("dedup", RequiresDuplicateDetection=True), queue("events", RequiresSession=True),
    queue("dlq-list"), queue("dlq-resubmit"), queue("dlq-ids"), queue("dlq-purge"), queue("dlq-confirm"),
    queue("progress"), queue("reuse"), queue("seed-orders"), queue("seed-events"), queue("dlq-long"),
    queue("late", RequiresDuplicateDetection=True, DuplicateDetectionHistoryTimeWindow="PT2S"),
)


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with start_broker(CONFIG) as running:
        yield running


@pytest.fixture
def conn(broker: Broker) -> str:
    return broker.connection_string


def test_send_generated_orders_with_business_ids_and_correlation(conn: str) -> None:
    assert main(["send", "--queue", "plain", "--generate", "12", "--seed", "1", "--connection-string", conn]) == 0
    received = drain(conn, "plain")
    assert len(received) == 12
    for message in received:
        body = json.loads(b"".join(message.body))
        assert message.message_id == body["orderId"]
        assert message.correlation_id.startswith("trace-")
        assert message.content_type == "application/json"


def test_send_events_go_to_the_order_session_in_order(conn: str) -> None:
    assert main(["send", "--queue", "events", "--generate", "6", "--kind", "events", "--seed", "2",
                 "--connection-string", conn]) == 0
    first = drain_first_session(conn)
    sequences = [json.loads(b"".join(m.body))["data"]["sequence"] for m in first]
    assert sequences == sorted(sequences) and sequences[0] == 2
    assert all(m.session_id == json.loads(b"".join(m.body))["subject"] for m in first)


def drain_first_session(conn: str) -> list:
    with (
        ServiceBusClient.from_connection_string(conn) as client,
        client.get_queue_receiver("events", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2) as receiver,
    ):
        batch = receiver.receive_messages(max_message_count=10, max_wait_time=2)
        for message in batch:
            receiver.complete_message(message)
        return batch


def test_duplicates_are_exact_copies_and_the_queue_drops_them_when_it_detects_duplicates(conn: str,
                                                                                      tmp_path: Path) -> None:
    path = tmp_path / "orders.jsonl"
    assert main(["send", "--queue", "plain", "--generate", "1", "--seed", "3", "--connection-string", conn]) == 0
    [original] = drain(conn, "plain")
    path.write_text(b"".join(original.body).decode() + "\n")
    send = ["send", "--file", str(path), "--duplicates", "1", "--connection-string", conn]
    assert main([*send, "--queue", "plain"]) == 0
    copies = drain(conn, "plain")
    assert [m.message_id for m in copies] == [original.message_id] * 2
    assert b"".join(copies[0].body) == b"".join(copies[1].body)
    assert main([*send, "--queue", "dedup"]) == 0
    assert [m.message_id for m in drain(conn, "dedup")] == [original.message_id]


def test_reused_ids_carry_other_content(conn: str) -> None:
    assert main(["send", "--queue", "reuse", "--generate", "3", "--reuse-ids", "1", "--seed", "4",
                 "--connection-string", conn]) == 0
    received = drain(conn, "reuse")
    assert len(received) == 6
    by_id: dict[str, set[bytes]] = {}
    for message in received:
        by_id.setdefault(message.message_id, set()).add(b"".join(message.body))
    assert all(len(bodies) == 2 for bodies in by_id.values())


def test_long_runs_show_progress(conn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["send", "--queue", "progress", "--generate", "600", "--seed", "5", "--connection-string", conn]) == 0
    err = capsys.readouterr().err
    assert "sent 500/600 messages" in err and "sent 600 message(s) to progress" in err
    assert len(drain(conn, "progress")) == 600


def test_dlq_list_as_table_and_json(conn: str, capsys: pytest.CaptureFixture[str]) -> None:
    dead_letter(conn, "dlq-list", [("m-1", "InvalidMessage"), ("m-2", "PayloadMismatch")])
    assert main(["dlq", "list", "--queue", "dlq-list", "--connection-string", conn]) == 0
    table = capsys.readouterr().out
    assert "messageId" in table and "m-1" in table and "PayloadMismatch" in table
    assert main(["dlq", "list", "--queue", "dlq-list", "--json", "--connection-string", conn]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [set(r) for r in rows] == [{"messageId", "reason", "description", "deliveryCount", "enqueuedTime"}] * 2
    assert {(r["messageId"], r["reason"], r["description"]) for r in rows} == {
        ("m-1", "InvalidMessage", "because m-1"), ("m-2", "PayloadMismatch", "because m-2")}


def test_dlq_resubmit_by_reason_sends_back_then_removes(conn: str) -> None:
    dead_letter(conn, "dlq-resubmit", [("r-1", "OutOfOrder"), ("r-2", "InvalidMessage"), ("r-3", "OutOfOrder")])
    no_detection = ["--detection-window", "0", "--connection-string", conn]  # the broker cannot tell sbctl
    assert main(["dlq", "resubmit", "--queue", "dlq-resubmit", "--reason", "OutOfOrder", "--dry-run",
                 *no_detection]) == 0
    assert drain(conn, "dlq-resubmit") == []  # dry run: nothing moved
    assert main(["dlq", "resubmit", "--queue", "dlq-resubmit", "--reason", "OutOfOrder", *no_detection]) == 0
    back = drain(conn, "dlq-resubmit")
    assert sorted(m.message_id for m in back) == ["r-1", "r-3"]
    for message in back:
        assert json.loads(b"".join(message.body)) == {"orderId": message.message_id}
        assert message.application_properties.get(b"origin") == b"test"
        assert b"DeadLetterReason" not in (message.application_properties or {})
    assert [m.message_id for m in drain(conn, "dlq-resubmit", dead_letter=True)] == ["r-2"]


def test_dlq_resubmit_by_ids(conn: str) -> None:
    dead_letter(conn, "dlq-ids", [("i-1", "X"), ("i-2", "X"), ("i-3", "X")])
    assert main(["dlq", "resubmit", "--queue", "dlq-ids", "--ids", "i-1", "i-3", "--detection-window", "0",
                 "--connection-string", conn]) == 0
    assert sorted(m.message_id for m in drain(conn, "dlq-ids")) == ["i-1", "i-3"]


def test_dlq_purge_with_yes_deletes_the_selection(conn: str) -> None:
    dead_letter(conn, "dlq-purge", [("p-1", "InvalidMessage"), ("p-2", "PayloadMismatch")])
    assert main(["dlq", "purge", "--queue", "dlq-purge", "--reason", "InvalidMessage", "--yes",
                 "--connection-string", conn]) == 0
    assert [m.message_id for m in drain(conn, "dlq-purge", dead_letter=True)] == ["p-2"]


def test_dlq_purge_asks_first(conn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dead_letter(conn, "dlq-confirm", [("c-1", "InvalidMessage")])
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    assert main(["dlq", "purge", "--queue", "dlq-confirm", "--connection-string", conn]) == 1
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    assert main(["dlq", "purge", "--queue", "dlq-confirm", "--connection-string", conn]) == 0
    assert drain(conn, "dlq-confirm", dead_letter=True) == []


def test_missing_entity_is_a_clear_error(conn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dlq", "list", "--queue", "no-such-queue", "--connection-string", conn]) == 1
    assert "no-such-queue" in capsys.readouterr().err


def test_unreachable_broker_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    # A port held bound but not listening refuses every connection, and no parallel test's broker can take it
    # (a broker's port freed after it stops can be reused at once).
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        dead = connection_string("127.0.0.1", port)
        assert main(["send", "--queue", "plain", "--generate", "1", "--connection-string", dead]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"cannot reach Service Bus at 127.0.0.1:{port} (plain AMQP)" in err and "connection refused" in err


def test_connection_string_from_the_environment_and_module_entry_point(conn: str) -> None:
    run = subprocess.run([sys.executable, "-m", "sbctl", "dlq", "list", "--queue", "plain", "--json"], cwd=ROOT,
                         env={**os.environ, "SERVICEBUS_CONNECTION_STRING": conn}, capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode == 3, run.stderr  # nothing matched: the dead-letter queue is empty
    assert json.loads(run.stdout) == []


@pytest.mark.skipif(not os.environ.get("SBCTL_TEST_NAMESPACE"),
                    reason="needs a real Azure Service Bus namespace: set SBCTL_TEST_NAMESPACE (and sign in)")
def test_namespace_with_default_azure_credential() -> None:
    assert main(["dlq", "list", "--queue", "orders", "--namespace", os.environ["SBCTL_TEST_NAMESPACE"]]) == 0


def sent_total(err: str) -> int:
    match = re.search(r"^sent (\d+) message\(s\) to ", err, re.MULTILINE)
    assert match, err
    return int(match.group(1))


def test_events_of_a_seed_are_the_lifecycles_of_the_orders_that_seed_places(conn: str) -> None:
    # Faults on the orders (drawn from their own generator) must not change which orders the seed makes.
    assert main(["send", "--queue", "seed-orders", "--generate", "5", "--seed", "9", "--duplicates", "0.5",
                 "--reuse-ids", "0.5", "--detection-window", "0", "--connection-string", conn]) == 0
    assert main(["send", "--queue", "seed-events", "--generate", "5", "--kind", "events", "--seed", "9",
                 "--connection-string", conn]) == 0
    orders = {json.loads(b"".join(m.body))["orderId"] for m in drain(conn, "seed-orders")}
    events = [json.loads(b"".join(m.body)) for m in drain(conn, "seed-events")]
    assert len(orders) == 5 and {e["subject"] for e in events} == orders
    assert {e["data"]["sequence"] for e in events} >= {2}


def test_copies_the_queue_will_drop_are_warned_of_in_one_line(conn: str, capsys: pytest.CaptureFixture[str]) -> None:
    send = ["send", "--generate", "3", "--duplicates", "1", "--seed", "2", "--connection-string", conn]
    assert main([*send, "--queue", "dedup", "--detection-window", "PT1M"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sbctl: warning:")]
    assert len(warnings) == 1
    assert "the 3 --duplicates copies" in warnings[0] and "will not reach the consumer" in warnings[0]
    assert "--late-duplicates" in warnings[0]
    assert len(drain(conn, "dedup")) == 3  # the copies were dropped

    assert main([*send, "--queue", "plain", "--detection-window", "0"]) == 0  # a queue without detection
    assert "warning" not in capsys.readouterr().err
    assert len(drain(conn, "plain")) == 6

    assert main([*send, "--queue", "plain"]) == 0  # the broker cannot say: the warning says it assumed
    [warning] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sbctl: warning:")]
    assert "assumed" in warning and "--detection-window 0" in warning
    drain(conn, "plain")


def test_late_duplicates_go_after_the_window_and_reach_the_consumer(conn: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["send", "--queue", "late", "--generate", "3", "--late-duplicates", "1", "--after", "3",
                 "--detection-window", "PT2S", "--seed", "3", "--connection-string", conn]) == 0
    err = capsys.readouterr().err
    assert "warning" not in err and "3 late duplicate" in err and sent_total(err) == 6
    received = [m.message_id for m in drain(conn, "late")]
    assert len(received) == 6 and all(received.count(i) == 2 for i in received)


def test_late_duplicates_inside_the_window_are_warned_of(conn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["send", "--queue", "late", "--generate", "1", "--late-duplicates", "1", "--after", "0",
                 "--detection-window", "PT1M", "--connection-string", conn]) == 0
    [warning] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sbctl: warning:")]
    assert "the 1 --late-duplicates copies" in warning and "leave --after out" in warning
    drain(conn, "late")


def test_progress_counts_what_is_really_sent(conn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["send", "--queue", "progress", "--generate", "400", "--duplicates", "0.5", "--seed", "5",
                 "--detection-window", "0", "--connection-string", conn]) == 0
    err = capsys.readouterr().err
    total = sent_total(err)
    assert total > 500 and f"sent 500/{total} messages" in err
    assert len(drain(conn, "progress")) == total


def test_a_local_endpoint_without_the_emulator_flag_is_named_as_the_cause(
    conn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tls = conn.replace("UseDevelopmentEmulator=true;", "")
    assert main(["dlq", "list", "--queue", "plain", "--connection-string", tls]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "127.0.0.1:5671 (AMQP over TLS)" in err and "add UseDevelopmentEmulator=true" in err


def test_dlq_list_cuts_a_long_description_at_a_word_with_an_ellipsis(conn: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    description = "Expected `int` >= 1 - at `$.items[0].quantity` " + "and then some more words " * 5
    with ServiceBusClient.from_connection_string(conn) as client:
        with client.get_queue_sender("dlq-long") as sender:
            sender.send_messages(ServiceBusMessage("{}", message_id="long-1"))
        with client.get_queue_receiver("dlq-long", max_wait_time=2) as receiver:
            [message] = receiver.receive_messages(max_message_count=1, max_wait_time=2)
            receiver.dead_letter_message(message, reason="InvalidMessage", error_description=description)
    assert main(["dlq", "list", "--queue", "dlq-long", "--connection-string", conn]) == 0
    [row] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("long-1")]
    shown = row.split("InvalidMessage", 1)[1].strip().split("…")[0]
    assert "…" in row and description.startswith(shown) and description[len(shown)] == " "
    assert main(["dlq", "list", "--queue", "dlq-long", "--json", "--connection-string", conn]) == 0
    assert json.loads(capsys.readouterr().out)[0]["description"] == description
