"""The broker's tick: it wakes for the earliest deadline (a lock, a scheduled message, a TTL, a session wait), and
otherwise once a second, where it ticked 20 times a second whatever happened (half an idle broker's CPU)."""

from __future__ import annotations

import datetime
import math
import time
from typing import Any

from azure.servicebus import ServiceBusClient, ServiceBusMessage

from devservers.servicebus import start_broker
from devservers.servicebus.config import load_config
from devservers.servicebus.server import IDLE_TICK_SECONDS, TICK_SECONDS
from devservers.servicebus.store import Envelope, Namespace, Queue
from tests.servicebus.conftest import build_config

T0 = 1_000_000.0


def _queue(**properties: Any) -> Queue:
    config = {"UserConfig": {"Namespaces": [{"Name": "ns", "Queues": [{"Name": "q", "Properties": properties}]}]}}
    return Namespace(load_config(config)).queues["q"]


def test_the_alarm_is_the_earliest_deadline_of_every_kind_and_moves_on_once_it_is_taken() -> None:
    queue = _queue(LockDuration="PT10S", DefaultMessageTimeToLive="PT30S")
    alarm = queue.namespace.alarm
    assert alarm.earliest == math.inf  # nothing to wake for
    queue.intake.send([Envelope(payload=None, message_id="a")], T0)
    assert alarm.earliest == T0 + 30  # its TTL
    queue.intake.send([Envelope(payload=None, message_id="b", scheduled_enqueue_time=T0 + 5)], T0)
    assert alarm.earliest == T0 + 5  # the scheduled message, lowered within the call that added it
    assert queue.next_message(object(), T0 + 1, peek_lock=True) is not None
    queue.process_timers(T0 + 5)
    assert alarm.reset() == T0 + 11  # the lock taken at T0 + 1, once the schedule fell due
    queue.process_timers(T0 + 11)
    assert alarm.reset() == T0 + 30


def test_an_idle_broker_ticks_once_a_second_and_a_deadline_brings_the_tick_forward() -> None:
    with start_broker(build_config()) as broker:
        handler = broker._runner.handler
        time.sleep(2 * IDLE_TICK_SECONDS)
        assert handler._tick_at - handler._ticked_at > 10 * TICK_SECONDS  # not on the 20-a-second beat
        with ServiceBusClient.from_connection_string(broker.connection_string) as client, \
                client.get_queue_sender("basic") as sender, \
                client.get_queue_receiver("basic", max_wait_time=10) as receiver:
            time.sleep(2 * IDLE_TICK_SECONDS)  # the clients' own events are over
            due = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=0.5)
            sender.schedule_messages(ServiceBusMessage(b"due"), due)
            # The schedule's event planned the tick for the message's time, not the idle beat's.
            assert handler._tick_at <= due.timestamp() + TICK_SECONDS
            [message] = receiver.receive_messages(max_wait_time=10)
            assert message.enqueued_time_utc is not None and message.enqueued_time_utc >= due - \
                datetime.timedelta(seconds=0.01)
            receiver.complete_message(message)
