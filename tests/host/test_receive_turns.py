"""A queue trigger's slots on the local host hold a receiver two at a time while messages come one by one, and every
slot holds one once a receive call returns a message (``devservers.host.servicebus.ReceiveTurns``)."""

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

from devservers.host.servicebus import RECEIVE_WAIT_SECONDS, RECEIVERS_AT_ONCE, ReceiveTurns
from devservers.servicebus import Broker
from tests.host.conftest import NEEDS_313, RULES_APP, HostProcess, eventually


def test_receive_turns_open_to_every_slot_after_a_message_and_close_one_by_one_down_to_the_least() -> None:
    turns, stopping = ReceiveTurns(2, 4), threading.Event()
    assert turns.take(stopping) and turns.take(stopping) and turns.holding == 2
    assert turns.keep_after_none()  # two hold a receiver while none comes
    turns.received()  # a message came: every slot may hold one
    assert turns.take(stopping) and turns.take(stopping) and turns.holding == 4
    # Calls that return none close a turn each, and the slots past the open turns let their receivers go.
    assert not turns.keep_after_none() and turns.holding == 3
    assert not turns.keep_after_none() and turns.holding == 2
    assert turns.keep_after_none() and turns.keep_after_none() and turns.holding == 2  # never fewer than the least
    waiting = threading.Thread(target=turns.take, args=(stopping,))
    waiting.start()
    stopping.set()
    turns.wake()  # the stop: a slot waiting for its turn ends now, not at its next look
    waiting.join(timeout=2)
    assert not waiting.is_alive() and not turns.take(stopping) and turns.holding == 2


def opened(records: list[logging.LogRecord], queue: str, *, senders: int) -> int:
    """The receivers opened on ``queue``: each opens a connection of its own and puts a token for the queue, as each
    of the test's ``senders`` did."""
    return sum(1 for r in records if r.name == "devservers.servicebus.requests"
               and re.fullmatch(rf"put-token \S+/{queue}: 200", r.getMessage())) - senders


def most_at_once(journal: Path) -> int:
    """The most invocations of ``slow`` that ran at the same time, by the journal's started and completed lines."""
    running = most = 0
    for line in journal.read_text().splitlines():
        entry = json.loads(line)
        if entry["function"] == "slow":
            running += 1 if entry["event"] == "started" else -1
            most = max(most, running)
    return most


@NEEDS_313
def test_an_idle_queue_trigger_holds_two_receivers_and_a_burst_has_every_slot_receive(
    broker: Broker, tmp_path: Path, start_host: Callable[..., HostProcess], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="devservers.servicebus.requests")
    journal = tmp_path / "journal.jsonl"
    start_host(RULES_APP, {"FUNCTIONS_WORKER_RUNTIME": "python", "ServiceBusConnection": broker.connection_string,
                           "RULES_JOURNAL": str(journal),
                           "AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentCalls": "8"})
    eventually(lambda: opened(caplog.records, "slow", senders=0) >= RECEIVERS_AT_ONCE, what="the first receivers")
    time.sleep(2 * RECEIVE_WAIT_SECONDS)  # receive calls end with none and begin again; no other slot opens one
    assert opened(caplog.records, "slow", senders=0) == RECEIVERS_AT_ONCE
    ids = [f"m-{uuid.uuid4()}" for _ in range(8)]
    with ServiceBusClient.from_connection_string(broker.connection_string) as client, \
            client.get_queue_sender("slow") as sender:
        sender.send_messages([ServiceBusMessage(b"{}", message_id=m) for m in ids])
    eventually(lambda: journal.exists() and journal.read_text().count('"completed"') == 8, timeout=60,
               what="every message completed")
    # The first message let every slot hold a receiver: more ran at once than the two that held one when it came
    # (each takes 2 s), and every one of the 8 slots opened a receiver.
    assert most_at_once(journal) > RECEIVERS_AT_ONCE
    assert opened(caplog.records, "slow", senders=1) >= 8
