"""Session slots on the local host let a session go as the Functions host does: after host.json's
``sessionIdleTimeout`` without a message, or, when it is unset, after the client's try timeout (60 s)."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from devservers.host.core import HostConfig
from devservers.host.servicebus import (
    ACCEPTS_AT_ONCE,
    QUICK_ACCEPT_SECONDS,
    RELEASE_RATE_SETTING,
    RELEASED_MID_INVOCATION,
    TRY_TIMEOUT_SECONDS,
    AcceptTurns,
)
from devservers.servicebus import Broker
from tests.host.conftest import NEEDS_313, RULES_APP, HostProcess, eventually, peek

SETTING = "AzureFunctionsJobHost__extensions__serviceBus__"
RELEASED = re.compile(r"in_sessions session (\S+) released after (\d+) messages, ([\d.]+) s idle")


def config(service_bus: dict[str, object]) -> HostConfig:
    return HostConfig(Path("."), {}, {"extensions": {"serviceBus": service_bus}})


def test_an_unset_session_idle_timeout_is_the_try_timeout_and_that_defaults_to_60_seconds() -> None:
    options = config({}).service_bus()
    assert options.session_idle_timeout_seconds is None
    assert options.session_idle_seconds == options.try_timeout_seconds == TRY_TIMEOUT_SECONDS == 60.0
    assert config({"clientRetryOptions": {"tryTimeout": "00:00:07"}}).service_bus().session_idle_seconds == 7.0


def test_host_json_session_idle_timeout_wins_over_the_try_timeout() -> None:
    options = config({"sessionIdleTimeout": "00:00:00.2", "clientRetryOptions": {"tryTimeout": "00:00:30"}})
    assert options.service_bus().session_idle_seconds == 0.2


def releases(host: HostProcess) -> list[tuple[str, int, float]]:
    return [(s, int(n), float(idle)) for s, n, idle in RELEASED.findall(host.output())]


def send(broker: Broker, *messages: tuple[str, str]) -> None:
    """(session, message id) pairs, in one batch, so that they are queued together."""
    with ServiceBusClient.from_connection_string(broker.connection_string) as client, \
            client.get_queue_sender("in-sessions") as sender:
        sender.send_messages([ServiceBusMessage(b"{}", message_id=m, session_id=s) for s, m in messages])


@pytest.fixture
def sessions_host(broker: Broker, tmp_path: Path,
                  start_host: Callable[..., HostProcess]) -> Callable[..., HostProcess]:
    def start(**service_bus: str) -> HostProcess:
        values = {"FUNCTIONS_WORKER_RUNTIME": "python", "ServiceBusConnection": broker.connection_string,
                  "RULES_JOURNAL": str(tmp_path / "journal.jsonl"), f"{SETTING}maxConcurrentSessions": "1"}
        values.update({SETTING + name.replace(".", "__"): value for name, value in service_bus.items()})
        return start_host(RULES_APP, values)
    return start


@NEEDS_313
def test_with_the_idle_timeout_unset_a_slot_holds_an_idle_session_for_the_try_timeout(
    broker: Broker, sessions_host: Callable[..., HostProcess]
) -> None:
    host = sessions_host(**{"clientRetryOptions.tryTimeout": "00:00:03"})
    first, second, message_id = f"s-{uuid.uuid4()}", f"s-{uuid.uuid4()}", f"m-{uuid.uuid4()}"
    send(broker, (first, message_id))
    eventually(lambda: f"in_sessions messageId={message_id} " in host.output(), what="the first session's message")
    send(broker, (second, f"m-{uuid.uuid4()}"))
    eventually(lambda: [r for r in releases(host) if r[0] == second], what="the second session handled and let go")
    [(_, handled, idle)] = [r for r in releases(host) if r[0] == first]
    # One slot: the second session waited until the first had been idle for the whole try timeout.
    assert handled == 1 and idle >= 3.0


@NEEDS_313
def test_a_slot_lets_its_session_go_after_the_session_idle_timeout_having_handed_over_all_its_messages(
    broker: Broker, sessions_host: Callable[..., HostProcess]
) -> None:
    host = sessions_host(sessionIdleTimeout="00:00:01")
    session = f"s-{uuid.uuid4()}"
    send(broker, *[(session, f"m-{n}-{uuid.uuid4()}") for n in range(3)])
    [(_, handled, idle)] = eventually(lambda: [r for r in releases(host) if r[0] == session],
                                      what="the session let go")
    assert handled == 3 and 1.0 <= idle < TRY_TIMEOUT_SECONDS


@NEEDS_313
def test_a_host_holding_an_idle_session_stops_without_waiting_out_the_try_timeout(
    broker: Broker, sessions_host: Callable[..., HostProcess]
) -> None:
    host = sessions_host()  # sessionIdleTimeout and tryTimeout unset: the slot would hold the session 60 s
    message_id = f"m-{uuid.uuid4()}"
    send(broker, (f"s-{uuid.uuid4()}", message_id))
    eventually(lambda: f"in_sessions messageId={message_id} " in host.output(), what="the message handled")
    assert host.terminate(timeout=20) == 0
    assert "released after 1 messages" in host.output()


@NEEDS_313
def test_a_host_whose_session_slot_waits_on_its_accept_stops_without_waiting_out_the_try_timeout(
    broker: Broker, sessions_host: Callable[..., HostProcess]
) -> None:
    host = sessions_host()  # its one slot asks for a session for the try timeout, 60 s, with none to give
    eventually(lambda: "host ready" in host.output(), what="the host ready")
    assert host.terminate(timeout=20) == 0
    # What comes after the stop was not taken by the slot's wait: it is delivered for the first time.
    session, message_id = f"s-{uuid.uuid4()}", f"m-{uuid.uuid4()}"
    send(broker, (session, message_id))
    with ServiceBusClient.from_connection_string(broker.connection_string) as client, \
            client.get_queue_receiver("in-sessions", session_id=session, max_wait_time=5) as receiver:
        [message] = receiver.receive_messages(max_wait_time=5)
        assert (message.message_id, message.delivery_count) == (message_id, 0)
        receiver.complete_message(message)


def asked(records: list[logging.LogRecord], queue: str, *, senders: int) -> int:
    """The receivers that asked the broker for a session of ``queue``: each opens a connection of its own and puts a
    token for the queue before it attaches (the broker logs an attach only once it has given the session), as each
    of the test's ``senders`` did."""
    return sum(1 for r in records if r.name == "devservers.servicebus.requests"
               and re.fullmatch(rf"put-token \S+/{queue}: 200", r.getMessage())) - senders


@NEEDS_313
def test_a_hosts_session_slots_ask_for_a_session_two_at_a_time_and_hold_every_session_they_took_at_once(
    broker: Broker, sessions_host: Callable[..., HostProcess], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="devservers.servicebus.requests")
    host = sessions_host(maxConcurrentSessions="8")  # the idle timeout unset: a slot holds an idle session 60 s
    eventually(lambda: asked(caplog.records, "in-sessions", senders=0) >= ACCEPTS_AT_ONCE, what="the first to ask")
    time.sleep(QUICK_ACCEPT_SECONDS + 1)  # so that the session sent next does not find an accept just begun
    # Of the 8 free slots, two ask, and the others wait their turn.
    assert asked(caplog.records, "in-sessions", senders=0) == ACCEPTS_AT_ONCE
    sessions = [(f"s-{uuid.uuid4()}", f"m-{uuid.uuid4()}") for _ in range(8)]
    send(broker, sessions[0])
    eventually(lambda: f"in_sessions messageId={sessions[0][1]} " in host.output(), what="the first session's message")
    # The slot given it had waited for it, so that one more slot took the turn it left, and no other.
    eventually(lambda: asked(caplog.records, "in-sessions", senders=1) == ACCEPTS_AT_ONCE + 1, what="a third to ask")
    # A burst: an accept that finds a session waiting lets every free slot ask.
    send(broker, *sessions[1:])
    eventually(lambda: all(f"in_sessions messageId={m} " in host.output() for _, m in sessions), what="every message")
    # Every slot holds the session it took, none let go yet: 8 sessions held at once, each slot having asked once.
    assert releases(host) == [] and asked(caplog.records, "in-sessions", senders=2) == 8
    assert host.terminate(timeout=20) == 0
    assert len(releases(host)) == 8


def test_accept_turns_open_to_every_slot_for_a_session_found_waiting_and_close_one_by_one_down_to_the_least() -> None:
    turns, stopping = AcceptTurns(2, 4), threading.Event()
    assert turns.take(stopping) and turns.take(stopping) and turns.open == 2
    turns.give_back(quick=True)  # a session was waiting: every free slot may ask
    assert turns.open == 4 and turns.take(stopping) and turns.take(stopping) and turns.take(stopping)
    for _ in range(3):
        turns.give_back(quick=False)  # accepts that waited, or found none
    assert turns.open == 2
    turns.give_back(quick=False)
    assert turns.open == 2  # never fewer than the least
    stopping.set()
    assert not turns.take(stopping)


def started(journal: Path, message_id: str) -> int:
    return sum(1 for line in journal.read_text().splitlines() if json.loads(line) == {
        "function": "slow_sessions", "messageId": message_id, "event": "started"}) if journal.exists() else 0


@NEEDS_313
def test_the_chaos_fault_lets_a_session_go_mid_invocation_and_another_slot_runs_the_same_message_in_parallel(
    broker: Broker, tmp_path: Path, start_host: Callable[..., HostProcess]
) -> None:
    journal = tmp_path / "journal.jsonl"
    values = {"FUNCTIONS_WORKER_RUNTIME": "python", "ServiceBusConnection": broker.connection_string,
              "RULES_JOURNAL": str(journal), RELEASE_RATE_SETTING: "1", f"{SETTING}sessionIdleTimeout": "00:00:00.2"}
    host = start_host(RULES_APP, values)
    message_id, session_id = f"m-{uuid.uuid4()}", f"s-{uuid.uuid4()}"
    with ServiceBusClient.from_connection_string(broker.connection_string) as client, \
            client.get_queue_sender("slow-sessions") as sender:
        sender.send_messages(ServiceBusMessage(b"{}", message_id=message_id, session_id=session_id))
    # Every delivery's session is let go under it, and another slot takes the message at once.
    eventually(lambda: started(journal, message_id) >= 3, what="three deliveries started")
    assert host.terminate(timeout=30) == 0
    events = [json.loads(line)["event"] for line in journal.read_text().splitlines()
              if json.loads(line)["messageId"] == message_id]
    # The second delivery started before the first had finished (the first waits for it, 30 s at most): in parallel.
    assert events[:2] == ["started", "started"], events
    assert "completed" not in events and host.output().count(RELEASED_MID_INVOCATION) >= 3
    # A session closed under an unsettled message does not count a delivery (Service Bus, "Impact of delivery
    # count"): after more deliveries than MaxDeliveryCount 3, the message still waits, uncounted.
    assert [m for m in peek(broker, "slow-sessions", dead_letters=True) if m.message_id == message_id] == []
    with ServiceBusClient.from_connection_string(broker.connection_string) as client, \
            client.get_queue_receiver("slow-sessions", session_id=session_id) as receiver:
        [waiting] = receiver.peek_messages(max_message_count=10)
    assert (waiting.message_id, waiting.delivery_count) == (message_id, 0)
