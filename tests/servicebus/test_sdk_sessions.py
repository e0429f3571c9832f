"""Sessions on the local broker, exercised with the unmodified azure-servicebus SDK."""

from __future__ import annotations

import datetime
import threading
import time

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessage, ServiceBusReceiver
from azure.servicebus.exceptions import (
    OperationTimeoutError,
    ServiceBusError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)

from tests.servicebus.conftest import Handlers, collect, opened, wait_for


def _messages(*pairs: tuple[str, str]) -> list[ServiceBusMessage]:
    return [ServiceBusMessage(body, session_id=session) for session, body in pairs]


def test_session_receiver_gets_its_session_in_order_and_settles_on_its_link(sb: Handlers) -> None:
    queue = "sessions-fifo"
    with opened(sb.sender(queue), sb.receiver(queue, session_id="s-1")) as (sender, receiver):
        sender.send_messages(_messages(("s-1", "a"), ("s-2", "x"), ("s-1", "b"), ("s-1", "c")))
        a, b, c = collect(receiver, 3)
        assert [str(m) for m in (a, b, c)] == ["a", "b", "c"]
        assert {m.session_id for m in (a, b, c)} == {"s-1"}
        assert receiver.session.session_id == "s-1"
        locked_until = receiver.session.locked_until_utc
        assert locked_until is not None and locked_until > datetime.datetime.now(datetime.UTC)
        receiver.abandon_message(a)  # comes back first (FIFO), with one more attempt counted
        [again] = collect(receiver, 1)
        assert (str(again), again.delivery_count) == ("a", 1)
        for message in (again, b, c):
            receiver.complete_message(message)
        assert receiver.peek_messages(5, sequence_number=1) == []  # peek is scoped to the session
        # s-2 was untouched.
        assert [str(m) for m in sb.client.get_queue_receiver(queue, session_id="s-2").peek_messages(5)] == ["x"]


def test_next_available_session_is_one_with_messages(sb: Handlers) -> None:
    queue = "sessions-next"
    with opened(sb.sender(queue)) as (sender,):
        sender.send_messages(_messages(("only", "1"), ("only", "2")))
    with opened(sb.receiver(queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=5)) as (receiver,):
        assert receiver.session.session_id == "only"
        assert [str(m) for m in collect(receiver, 2)] == ["1", "2"]


def test_locked_session_cannot_be_accepted_by_another_receiver(sb: Handlers) -> None:
    queue = "sessions-locked"
    with opened(sb.sender(queue), sb.receiver(queue, session_id="busy")) as (sender, first):
        sender.send_messages(_messages(("busy", "1"), ("busy", "2")))
        [one] = collect(first, 1)
        first.complete_message(one)
        with pytest.raises(SessionCannotBeLockedError):
            sb.receiver(queue, session_id="busy").__enter__()
        first.close()  # closing the receiver releases the session lock at once
        with opened(sb.receiver(queue, session_id="busy")) as (second,):
            assert [str(m) for m in collect(second, 1)] == ["2"]


def test_session_state_and_session_lock_renewal(sb: Handlers) -> None:
    queue = "sessions-state"
    with opened(sb.receiver(queue, session_id="stateful")) as (receiver,):
        session = receiver.session
        assert session.get_state() is None
        session.set_state(b"step-2")
        assert session.get_state() == b"step-2"
        before = session.locked_until_utc
        assert before is not None
        renewed = session.renew_lock()
        assert renewed >= before and session.locked_until_utc == renewed
    with opened(sb.receiver(queue, session_id="stateful")) as (receiver,):
        assert receiver.session.get_state() == b"step-2"  # state outlives the session lock


def test_next_available_session_times_out_when_no_session_has_messages(sb: Handlers) -> None:
    receiver = sb.receiver("sessions-empty", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=1)
    with pytest.raises(OperationTimeoutError):
        receiver.__enter__()
    receiver.close()


def test_receivers_waiting_for_a_session_each_take_one_as_sessions_come_and_the_one_left_over_times_out(
    sb: Handlers,
) -> None:
    queue = "sessions-waiting"
    receivers = [sb.receiver(queue, session_id=NEXT_AVAILABLE_SESSION, max_wait_time=8) for _ in range(3)]
    outcomes: list[str] = []

    def accept(receiver: ServiceBusReceiver) -> None:
        try:
            receiver.__enter__()
            outcomes.append(receiver.session.session_id)
        except OperationTimeoutError:
            outcomes.append("timed out")

    threads = [threading.Thread(target=accept, args=(receiver,)) for receiver in receivers]
    for thread in threads:
        thread.start()
    time.sleep(1)  # the three are waiting (if one is not yet, it takes a session on its attach: the same outcome)
    with opened(sb.sender(queue)) as (sender,):
        sender.send_messages(_messages(("first", "1"), ("second", "2")))
    for thread in threads:
        thread.join(30)
    for receiver in receivers:
        receiver.close()
    assert sorted(outcomes) == ["first", "second", "timed out"]


def test_expired_session_lock_loses_the_session_and_its_messages(sb: Handlers) -> None:
    queue = "sessions-expiry"
    with opened(sb.sender(queue), sb.receiver(queue, session_id="slow")) as (sender, receiver):
        sender.send_messages(_messages(("slow", "m")))
        [message] = collect(receiver, 1)
        # LockDuration PT2S: the broker ends the session lock and detaches the receiver.
        wait_for(lambda: receiver.session.locked_until_utc < datetime.datetime.now(datetime.UTC), timeout=5)
        with pytest.raises(SessionLockLostError):
            wait_for(lambda: receiver.complete_message(message) or None, timeout=3)
    with opened(sb.receiver(queue, session_id="slow")) as (again,):
        [redelivered] = collect(again, 1)
        assert (str(redelivered), redelivered.delivery_count) == ("m", 1)
        again.complete_message(redelivered)


def test_sending_without_session_id_to_a_session_queue_is_rejected(sb: Handlers) -> None:
    with opened(sb.sender("sessions-required")) as (sender,):
        with pytest.raises(ServiceBusError, match="SessionId"):
            sender.send_messages(ServiceBusMessage("no session"))
        sender.send_messages(ServiceBusMessage("with session", session_id="s"))  # the link is still usable


def test_session_receiver_on_a_queue_without_sessions_is_refused(sb: Handlers) -> None:
    with pytest.raises(ServiceBusError, match="does not require sessions"):
        sb.receiver("not-sessionful", session_id="s").__enter__()


def test_a_session_closed_with_its_message_unsettled_gives_it_back_uncounted(sb: Handlers) -> None:
    # Service Bus's "Impact of delivery count" (message sessions): a session closed with messages not completed
    # does not increment their delivery count; an expired session lock does (the test above), as an abandon does.
    queue = "sessions-closed"
    with opened(sb.sender(queue), sb.receiver(queue, session_id="s")) as (sender, receiver):
        sender.send_messages(_messages(("s", "m")))
        [message] = collect(receiver, 1)
        assert message.delivery_count == 0
    for _ in range(12):  # more than MaxDeliveryCount: closing the session never dead-letters the message
        with opened(sb.receiver(queue, session_id="s")) as (again,):
            [redelivered] = collect(again, 1)
            assert (str(redelivered), redelivered.delivery_count) == ("m", 0)
    with opened(sb.receiver(queue, session_id="s")) as (again,):
        [redelivered] = collect(again, 1)
        again.abandon_message(redelivered)
        [abandoned] = collect(again, 1)
        assert abandoned.delivery_count == 1
        again.complete_message(abandoned)
