"""sbctl retries against the local broker with the real SDK: the copies a delayed retry scheduled, listed with when
and why, sent now (sent first, then cancelled), on a plain and on a session-enabled queue; and a dead-lettered copy
resubmitted as its original."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceivedMessage

from devservers.servicebus import Broker, start_broker
from idempotent_consumer import identity, retries
from sbctl import dlq
from sbctl.cli import main
from sbctl.detection import Detection
from tests.sbctl.queues import config, drain, queue

CONFIG = config(queue("retries-plain"), queue("retries-events", RequiresSession=True), queue("retries-dlq"),
                queue("retries-list"), queue("retries-rollback"),
                queue("retries-rollback-events", RequiresSession=True),
                queue("retries-short-lock", LockDuration="PT5S"))
FIRST = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with start_broker(CONFIG) as running:
        yield running


@pytest.fixture
def conn(broker: Broker) -> str:
    return broker.connection_string


def copy(original: str, attempt: int, *, due_in: float = 3600, session: str | None = None) -> ServiceBusMessage:
    """A copy as the consumer hands one on (idempotent_consumer.delivery): the retry properties, scheduled for later."""
    return ServiceBusMessage(
        b'{"orderId":"%s"}' % original.encode(), message_id=identity.retry_message_id(original, "7", attempt),
        session_id=session, application_properties={
            "tenant": "eu", retries.ORIGINAL: original, retries.CHAIN: "7", retries.ATTEMPT: str(attempt),
            retries.FIRST_FAILED_AT: FIRST.isoformat(), retries.REASON: "reserve-stock: HTTP 503"},
        scheduled_enqueue_time_utc=datetime.now(UTC) + timedelta(seconds=due_in))


def send(conn: str, name: str, *messages: ServiceBusMessage) -> None:
    with ServiceBusClient.from_connection_string(conn) as client, client.get_queue_sender(name) as sender:
        sender.send_messages(list(messages))


def test_list_shows_each_waiting_copy_with_when_and_why_and_leaves_the_others(
    conn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    send(conn, "retries-list", copy("ord-1", 2), copy("ord-2", 5),
         ServiceBusMessage(b"{}", message_id="later", scheduled_enqueue_time_utc=datetime.now(UTC)
                           + timedelta(hours=1)))
    assert main(["retries", "list", "--queue", "retries-list", "--json", "--connection-string", conn]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["originalMessageId"], r["attempt"], r["reason"], r["firstFailedAt"]) for r in rows] == [
        ("ord-1", 2, "reserve-stock: HTTP 503", FIRST.isoformat()),
        ("ord-2", 5, "reserve-stock: HTTP 503", FIRST.isoformat())]
    assert all(datetime.fromisoformat(r["due"]) > datetime.now(UTC) for r in rows)
    assert main(["retries", "list", "--queue", "retries-list", "--connection-string", conn]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["originalMessageId", "attempt", "due", "firstFailedAt", "reason"]


def test_send_now_delivers_the_copy_at_once_and_cancels_the_scheduled_one(
    conn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    send(conn, "retries-plain", copy("ord-3", 1), copy("ord-4", 1))
    assert main(["retries", "send-now", "--queue", "retries-plain", "--ids", "ord-3", "--connection-string",
                 conn]) == 0
    assert "sent now ord-3 (attempt 1)" in capsys.readouterr().out
    [arrived] = drain(conn, "retries-plain")
    properties = {k.decode(): v.decode() for k, v in arrived.application_properties.items()}
    assert properties[retries.ORIGINAL] == "ord-3" and properties["tenant"] == "eu"
    assert arrived.message_id == identity.retry_message_id("ord-3", "7", 1) + ".now"
    assert main(["retries", "list", "--queue", "retries-plain", "--json", "--connection-string", conn]) == 0
    assert [r["originalMessageId"] for r in json.loads(capsys.readouterr().out)] == ["ord-4"]


def test_send_now_needs_ids_or_all(conn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["retries", "send-now", "--queue", "retries-plain", "--connection-string", conn]) == 1
    assert capsys.readouterr().err.strip() == "sbctl: error: retries send-now needs --ids MESSAGE_ID ... or --all"


def test_a_session_queue_is_read_one_session_at_a_time_and_without_one_says_so(
    conn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    send(conn, "retries-events", copy("evt-1", 3, session="ord-9"))
    assert main(["retries", "list", "--queue", "retries-events", "--connection-string", conn]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give --session ORDER_ID" in err
    assert main(["retries", "list", "--queue", "retries-events", "--session", "ord-9", "--json",
                 "--connection-string", conn]) == 0
    assert [r["sessionId"] for r in json.loads(capsys.readouterr().out)] == ["ord-9"]
    assert main(["retries", "send-now", "--queue", "retries-events", "--session", "ord-9", "--all",
                 "--connection-string", conn]) == 0
    assert [m.session_id for m in drain(conn, "retries-events", session="ord-9")] == ["ord-9"]


def test_nothing_waiting_is_exit_status_3(conn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["retries", "list", "--queue", "retries-dlq", "--connection-string", conn]) == 3
    assert "nothing waits for a retry in retries-dlq" in capsys.readouterr().err


def test_a_dead_lettered_copy_is_listed_and_resubmitted_as_its_original_without_its_retry_properties(
    conn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    send(conn, "retries-dlq", copy("ord-5", 21, due_in=0))
    with ServiceBusClient.from_connection_string(conn) as client, \
            client.get_queue_receiver("retries-dlq", max_wait_time=5) as receiver:
        [message] = receiver.receive_messages(max_wait_time=5)
        receiver.dead_letter_message(message, reason="RetryLimitExceeded", error_description="tried for 4h00m00s")
    assert main(["dlq", "list", "--queue", "retries-dlq", "--json", "--connection-string", conn]) == 0
    assert [r["messageId"] for r in json.loads(capsys.readouterr().out)] == ["ord-5"]
    assert main(["dlq", "resubmit", "--queue", "retries-dlq", "--ids", "ord-5", "--detection-window", "0",
                 "--connection-string", conn]) == 0
    [again] = drain(conn, "retries-dlq")
    assert again.message_id == "ord-5"
    assert {k.decode() for k in again.application_properties} == {"tenant"}
    assert drain(conn, "retries-dlq", dead_letter=True) == []


def legacy_copy(original: str, attempt: int, *, session: str | None = None) -> ServiceBusMessage:
    """A copy as the release before these property names handed one on."""
    return ServiceBusMessage(
        b'{"orderId":"%s"}' % original.encode(), message_id=identity.retry_message_id(original, "8", attempt),
        session_id=session, application_properties={
            "tenant": "eu", retries.LEGACY.original: original, retries.LEGACY.chain: "8",
            retries.LEGACY.attempt: str(attempt), retries.LEGACY.first_failed_at: FIRST.isoformat()})


def dead_letter_all(conn: str, name: str, description: str, session: str | None = None) -> None:
    """Dead-letter what waits, as a release that knows no copy does: its MessageId is not the orderId."""
    with ServiceBusClient.from_connection_string(conn) as client, \
            client.get_queue_receiver(name, session_id=session, max_wait_time=5) as receiver:
        for message in receiver.receive_messages(max_message_count=3, max_wait_time=5):
            receiver.dead_letter_message(message, reason="InvalidMessage", error_description=description)


@pytest.mark.parametrize(("name", "session"), [("retries-rollback", None), ("retries-rollback-events", "ord-8")])
def test_after_a_rollback_the_copies_dead_lettered_invalid_are_mapped_back_and_no_other_dead_letter_is_touched(
    conn: str, name: str, session: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    invalid = ServiceBusMessage(b'{"orderId": 1}', message_id="ord-bad", session_id=session)
    send(conn, name, copy("ord-6", 1, due_in=0, session=session), legacy_copy("ord-7", 2, session=session), invalid)
    dead_letter_all(conn, name, "MessageId does not equal orderId", session)
    assert main(["dlq", "list", "--queue", name, "--copies", "--json", "--connection-string", conn]) == 0
    assert sorted(r["messageId"] for r in json.loads(capsys.readouterr().out)) == ["ord-6", "ord-7"]
    assert main(["dlq", "resubmit", "--queue", name, "--reason", "InvalidMessage", "--copies", "--detection-window",
                 "0", "--connection-string", conn]) == 0
    back = drain(conn, name, session=session)
    assert sorted(m.message_id for m in back) == ["ord-6", "ord-7"]  # under their original MessageIds
    assert all({k.decode() for k in m.application_properties} == {"tenant"} for m in back)
    assert [m.message_id for m in drain(conn, name, dead_letter=True)] == ["ord-bad"]  # not a copy: left alone


@dataclasses.dataclass(frozen=True)
class SlowOnOthers(dlq.Selection):
    """The copies; taking long over any other dead letter, past every lock of the pass (5 s here)."""

    def matches(self, message: ServiceBusReceivedMessage) -> bool:
        if retries.chain_of(dlq.text_properties(message)) is None:
            time.sleep(6)
            return False
        return super().matches(message)


def test_a_dead_letter_whose_lock_ran_out_while_the_pass_went_on_is_left_where_it_is(conn: str) -> None:
    name = "retries-short-lock"
    send(conn, name, copy("ord-8", 1, due_in=0), ServiceBusMessage(b"{}", message_id="not-a-copy"))
    dead_letter_all(conn, name, "MessageId does not equal orderId")
    sent: list[str | None] = []
    with ServiceBusClient.from_connection_string(conn) as client:
        done = dlq.resubmit(client, name, SlowOnOthers(reason="InvalidMessage", copies=True),
                            Detection(timedelta(0), "test"), report=lambda _: None, report_held=lambda _: None,
                            on_sent=lambda row: sent.append(row.message_id))
    assert [row.message_id for row in done.resubmitted] == ["ord-8"] == sent  # each send is heard of
    assert [m.message_id for m in drain(conn, name, dead_letter=True)] == ["not-a-copy"]  # back, untouched
