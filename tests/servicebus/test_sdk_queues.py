"""Queue behaviours of the local broker, exercised with the unmodified azure-servicebus SDK.

Peeks pass ``sequence_number=1`` explicitly: without it the SDK continues after the last message the
receiver saw, which would make "nothing left" assertions pass vacuously.
"""

from __future__ import annotations

import copy
import datetime
import time
import uuid

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.exceptions import MessageLockLostError, MessageNotFoundError

from tests.servicebus.conftest import Handlers, collect, nothing_to_receive, opened, wait_for

UTC = datetime.UTC
RECEIVE_AND_DELETE = ServiceBusReceiveMode.RECEIVE_AND_DELETE


def test_send_receive_complete_removes_the_message(sb: Handlers) -> None:
    with opened(sb.sender("basic"), sb.receiver("basic")) as (sender, receiver):
        sender.send_messages(ServiceBusMessage("hello", message_id="m-1", application_properties={"kind": "hi"}))
        [message] = collect(receiver, 1)
        assert str(message) == "hello"
        assert message.message_id == "m-1"
        assert message.application_properties == {b"kind": b"hi"}
        receiver.complete_message(message)
        assert receiver.peek_messages(10, sequence_number=1) == []


def test_batch_send_delivers_every_message_of_the_batch_in_order(sb: Handlers) -> None:
    with opened(sb.sender("batch"), sb.receiver("batch", receive_mode=RECEIVE_AND_DELETE)) as (sender, receiver):
        batch = sender.create_message_batch()
        for index in range(5):
            batch.add_message(ServiceBusMessage(f"item-{index}", application_properties={"index": index}))
        sender.send_messages(batch)
        received = collect(receiver, 5)
    assert [str(m) for m in received] == [f"item-{i}" for i in range(5)]
    assert [(m.application_properties or {}).get(b"index") for m in received] == list(range(5))
    assert [m.sequence_number for m in received] == [1, 2, 3, 4, 5]


def test_peek_lock_delivery_carries_lock_token_sequence_number_and_times(sb: Handlers) -> None:
    before = datetime.datetime.now(UTC) - datetime.timedelta(seconds=1)
    with opened(sb.sender("annotations"), sb.receiver("annotations")) as (sender, receiver):
        sender.send_messages([ServiceBusMessage("first"), ServiceBusMessage("second")])
        first, second = collect(receiver, 2)
        assert isinstance(first.lock_token, uuid.UUID) and first.lock_token != second.lock_token
        assert (first.sequence_number, second.sequence_number) == (1, 2)
        assert first.delivery_count == 0  # prior attempts, as Service Bus puts it in the AMQP header
        assert first.enqueued_time_utc is not None and before <= first.enqueued_time_utc
        assert first.locked_until_utc is not None
        lock_seconds = (first.locked_until_utc - first.enqueued_time_utc).total_seconds()
        assert 55 < lock_seconds < 65  # the default LockDuration, PT1M
        assert first.expires_at_utc == first.enqueued_time_utc + datetime.timedelta(hours=1)  # default TTL
        receiver.complete_message(first)
        receiver.complete_message(second)


def test_receive_and_delete_removes_messages_on_delivery(sb: Handlers) -> None:
    queue = "receive-and-delete"
    with opened(sb.sender(queue), sb.receiver(queue, receive_mode=RECEIVE_AND_DELETE)) as (sender, receiver):
        sender.send_messages(ServiceBusMessage("gone"))
        [message] = collect(receiver, 1)
        assert str(message) == "gone" and message.lock_token is None
        assert message.delivery_count == 0 and message.sequence_number == 1
        assert receiver.peek_messages(5, sequence_number=1) == []


def test_receive_takes_only_what_the_link_credit_allows(sb: Handlers) -> None:
    handlers = sb.sender("credit"), sb.receiver("credit"), sb.receiver("credit", receive_mode=RECEIVE_AND_DELETE)
    with opened(*handlers) as (sender, receiver, other):
        sender.send_messages([ServiceBusMessage(str(i)) for i in range(5)])
        taken = receiver.receive_messages(max_message_count=2, max_wait_time=2)
        assert [str(m) for m in taken] == ["0", "1"]
        # The rest was never sent to this receiver, so it is not locked: another receiver takes it at once.
        assert [m.delivery_count for m in receiver.peek_messages(5, sequence_number=3)] == [0, 0, 0]
        assert [str(m) for m in collect(other, 3)] == ["2", "3", "4"]
        for message in taken:
            receiver.complete_message(message)


def test_abandon_redelivers_with_delivery_count_incremented(sb: Handlers) -> None:
    with opened(sb.sender("abandon"), sb.receiver("abandon")) as (sender, receiver):
        sender.send_messages(ServiceBusMessage("retry me"))
        [first] = collect(receiver, 1)
        receiver.abandon_message(first)
        [second] = collect(receiver, 1)
        assert second.sequence_number == first.sequence_number
        assert (first.delivery_count, second.delivery_count) == (0, 1)
        assert second.lock_token != first.lock_token
        receiver.complete_message(second)


def test_deferred_message_is_only_reachable_by_sequence_number(sb: Handlers) -> None:
    with opened(sb.sender("defer"), sb.receiver("defer")) as (sender, receiver):
        sender.send_messages([ServiceBusMessage("later"), ServiceBusMessage("now")])
        later, now = collect(receiver, 2)
        receiver.defer_message(later)
        receiver.complete_message(now)
        assert nothing_to_receive(receiver)
        [peeked] = receiver.peek_messages(5, sequence_number=1)
        assert peeked.sequence_number == later.sequence_number and peeked.state.name == "DEFERRED"
        [deferred] = receiver.receive_deferred_messages([later.sequence_number])
        assert str(deferred) == "later" and deferred.lock_token is not None
        assert deferred.delivery_count == 1
        receiver.complete_message(deferred)  # deferred messages settle through $management
        assert receiver.peek_messages(5, sequence_number=1) == []


def test_management_update_disposition_settles_deferred_messages(sb: Handlers) -> None:
    queue = "mgmt-settle"
    with opened(sb.sender(queue), sb.receiver(queue), sb.dead_letters(queue)) as (sender, receiver, dlq):
        sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
        a, b = collect(receiver, 2)
        receiver.defer_message(a)
        receiver.defer_message(b)
        deferred_a, deferred_b = receiver.receive_deferred_messages([a.sequence_number, b.sequence_number])
        receiver.abandon_message(deferred_a)  # through update-disposition: it stays deferred
        receiver.dead_letter_message(deferred_b, reason="bad", error_description="unparseable")
        [again] = receiver.receive_deferred_messages([a.sequence_number])
        assert again.delivery_count == 2
        receiver.complete_message(again)
        with pytest.raises(MessageNotFoundError):
            receiver.receive_deferred_messages([a.sequence_number])
        [dead] = dlq.peek_messages(5, sequence_number=1)
        assert (str(dead), dead.dead_letter_reason, dead.dead_letter_error_description) == ("b", "bad", "unparseable")


def test_dead_letter_moves_message_with_reason_and_description(sb: Handlers) -> None:
    queue = "dead-letter"
    with opened(sb.sender(queue), sb.receiver(queue), sb.dead_letters(queue)) as (sender, receiver, dlq):
        sender.send_messages(ServiceBusMessage("poison", application_properties={"keep": "me"}))
        [message] = collect(receiver, 1)
        receiver.dead_letter_message(message, reason="ValidationFailed", error_description="amount < 0")
        assert receiver.peek_messages(5, sequence_number=1) == []
        [dead] = collect(dlq, 1)
        assert str(dead) == "poison"
        assert dead.sequence_number == message.sequence_number
        assert dead.dead_letter_reason == "ValidationFailed"
        assert dead.dead_letter_error_description == "amount < 0"
        assert dead.dead_letter_source == "dead-letter"
        assert dead.application_properties is not None
        assert dead.application_properties[b"keep"] == b"me"
        assert dead.application_properties[b"DeadLetterReason"] == b"ValidationFailed"
        dlq.complete_message(dead)
        assert dlq.peek_messages(5, sequence_number=1) == []


def test_expired_lock_makes_message_available_again_with_higher_delivery_count(sb: Handlers) -> None:
    queue = "lock-expiry"
    with opened(sb.sender(queue), sb.receiver(queue), sb.receiver(queue)) as (sender, first_receiver, second_receiver):
        sender.send_messages(ServiceBusMessage("slow"))
        [first] = collect(first_receiver, 1)
        # Locked for PT1S; once the lock expires the broker hands the message to the other receiver.
        [second] = wait_for(lambda: second_receiver.receive_messages(max_message_count=1, max_wait_time=1))
        assert second.sequence_number == first.sequence_number
        assert first.delivery_count is not None and second.delivery_count == first.delivery_count + 1
        with pytest.raises(MessageLockLostError):
            first_receiver.complete_message(first)
        second_receiver.complete_message(second)


def test_a_receiver_closed_with_a_message_unsettled_keeps_its_lock_until_it_expires_and_that_counts(
    sb: Handlers,
) -> None:
    # Service Bus keeps a message's lock when its (non-session) link closes: the SDK drains its credit before a
    # close "so that they do not remain locked by the service after closing the link" (AmqpReceiver.CloseAsync);
    # the lock then runs out, which counts a delivery. (A session closed under its messages, by contrast, gives
    # them back uncounted: test_sdk_sessions.)
    queue = "lock-expiry"
    with opened(sb.sender(queue), sb.receiver(queue)) as (sender, other):
        sender.send_messages(ServiceBusMessage("left"))
        with opened(sb.receiver(queue)) as (closing,):
            [first] = collect(closing, 1)
        [again] = wait_for(lambda: other.receive_messages(max_message_count=1, max_wait_time=1))
        # Counted: its lock ran out. A message the close gave back at once would come again uncounted.
        assert first.delivery_count is not None and again.delivery_count == first.delivery_count + 1
        other.complete_message(again)


def test_renew_lock_extends_the_lock(sb: Handlers) -> None:
    with opened(sb.sender("renew-lock"), sb.receiver("renew-lock")) as (sender, receiver):
        sender.send_messages(ServiceBusMessage("keep"))
        [message] = collect(receiver, 1)
        original = message.locked_until_utc
        assert original is not None
        deadline = time.monotonic() + 1.6  # past the PT1S lock, renewing every 0.3 s
        while time.monotonic() < deadline:
            time.sleep(0.3)
            renewed = receiver.renew_message_lock(message)
        assert renewed > original + datetime.timedelta(seconds=1)
        receiver.complete_message(message)  # the lock is still held
        assert receiver.peek_messages(5, sequence_number=1) == []


def test_settling_with_a_lock_the_broker_no_longer_holds_raises_lock_lost(sb: Handlers) -> None:
    queue = "lock-lost"
    with opened(sb.sender(queue), sb.receiver(queue), sb.receiver(queue)) as (sender, owner, other):
        sender.send_messages(ServiceBusMessage("contested"))
        [message] = collect(owner, 1)
        # Lock tokens are entity-wide: another receiver completes the message by its lock token (through
        # $management update-disposition, as the delivery is not on its link)...
        other.complete_message(copy.copy(message))
        # ...so the broker refuses the owner's settlement on its link with com.microsoft:message-lock-lost.
        with pytest.raises(MessageLockLostError):
            owner.abandon_message(message)


def test_renewing_an_expired_lock_raises_lock_lost(sb: Handlers) -> None:
    with opened(sb.sender("renew-lost"), sb.receiver("renew-lost")) as (sender, receiver):
        sender.send_messages(ServiceBusMessage("late"))
        [message] = collect(receiver, 1)
        # The lock (PT1S) expires and the message is back in the queue, counted as a failed delivery.
        wait_for(lambda: receiver.peek_messages(1, sequence_number=1)[0].delivery_count == 1)
        with pytest.raises(MessageLockLostError):
            receiver.renew_message_lock(message)


def test_max_delivery_count_dead_letters_the_message(sb: Handlers) -> None:
    queue = "max-delivery"
    with opened(sb.sender(queue), sb.receiver(queue), sb.dead_letters(queue)) as (sender, receiver, dlq):
        sender.send_messages(ServiceBusMessage("poison"))
        for expected_count in (0, 1):  # MaxDeliveryCount 2: two deliveries, then dead-lettered
            [message] = collect(receiver, 1)
            assert message.delivery_count == expected_count
            receiver.abandon_message(message)
        assert receiver.peek_messages(5, sequence_number=1) == []
        [dead] = dlq.peek_messages(5, sequence_number=1)
        assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
        assert dead.dead_letter_error_description == "Message could not be consumed after 2 delivery attempts."


def test_expired_message_is_removed(sb: Handlers) -> None:
    queue = "ttl-drop"
    with opened(sb.sender(queue), sb.receiver(queue), sb.dead_letters(queue)) as (sender, receiver, dlq):
        sender.send_messages(ServiceBusMessage("stale"))
        [peeked] = receiver.peek_messages(1, sequence_number=1)
        assert peeked.time_to_live == datetime.timedelta(seconds=1)  # capped by DefaultMessageTimeToLive PT1S
        assert peeked.expires_at_utc == peeked.enqueued_time_utc + datetime.timedelta(seconds=1)
        wait_for(lambda: receiver.peek_messages(1, sequence_number=1) == [])
        assert nothing_to_receive(receiver)
        assert dlq.peek_messages(1, sequence_number=1) == []


def test_expired_message_is_dead_lettered_when_configured(sb: Handlers) -> None:
    queue = "ttl-dead-letter"
    with opened(sb.sender(queue), sb.dead_letters(queue)) as (sender, dlq):
        sender.send_messages(ServiceBusMessage("stale"))
        [dead] = wait_for(lambda: dlq.receive_messages(max_message_count=1, max_wait_time=1))
        assert str(dead) == "stale"
        assert dead.dead_letter_reason == "TTLExpiredException"
        dlq.complete_message(dead)


def test_message_time_to_live_shorter_than_the_entity_default_applies(sb: Handlers) -> None:
    queue = "ttl-message"
    with opened(sb.sender(queue), sb.receiver(queue), sb.dead_letters(queue)) as (sender, receiver, dlq):
        sender.send_messages(
            [ServiceBusMessage("short-lived", time_to_live=datetime.timedelta(seconds=1)), ServiceBusMessage("long")]
        )
        [dead] = wait_for(lambda: dlq.peek_messages(5, sequence_number=1))
        assert str(dead) == "short-lived" and dead.dead_letter_reason == "TTLExpiredException"
        assert [str(m) for m in receiver.peek_messages(5, sequence_number=1)] == ["long"]


def test_duplicate_message_id_within_fixed_window_is_dropped(sb: Handlers) -> None:
    with opened(sb.sender("duplicates"), sb.receiver("duplicates")) as (sender, receiver):
        started = time.monotonic()
        sender.send_messages(ServiceBusMessage("original", message_id="order-1"))
        sender.send_messages(ServiceBusMessage("repeat", message_id="order-1"))  # accepted, then dropped
        sender.send_messages(ServiceBusMessage("other", message_id="order-2"))
        time.sleep(max(0.0, 1.2 - (time.monotonic() - started)))
        sender.send_messages(ServiceBusMessage("repeat later", message_id="order-1"))  # still in the window
        # The PT2S window runs from the first send; a repeat does not restart it.
        time.sleep(max(0.0, 2.3 - (time.monotonic() - started)))
        sender.send_messages(ServiceBusMessage("after window", message_id="order-1"))
        peeked = receiver.peek_messages(10, sequence_number=1)
        assert [str(m) for m in peeked] == ["original", "other", "after window"]


def test_peek_browses_without_locking_and_from_a_sequence_number(sb: Handlers) -> None:
    with opened(sb.sender("peek"), sb.receiver("peek")) as (sender, receiver):
        sender.send_messages([ServiceBusMessage(f"p{i}") for i in range(4)])
        assert [str(m) for m in receiver.peek_messages(2, sequence_number=1)] == ["p0", "p1"]
        assert [m.sequence_number for m in receiver.peek_messages(10, sequence_number=3)] == [3, 4]
        assert receiver.peek_messages(10, sequence_number=5) == []  # the broker answers 204
        peeked = receiver.peek_messages(1, sequence_number=1)[0]
        assert peeked.lock_token is None and peeked.delivery_count == 0
        assert len(collect(receiver, 4)) == 4  # nothing was locked by peeking


def test_peek_dead_letter_queue(sb: Handlers) -> None:
    queue = "peek-dlq"
    with opened(sb.sender(queue), sb.receiver(queue), sb.dead_letters(queue)) as (sender, receiver, dlq):
        sender.send_messages(ServiceBusMessage("x"))
        [message] = collect(receiver, 1)
        receiver.dead_letter_message(message, reason="r", error_description="d")
        [peeked] = dlq.peek_messages(5, sequence_number=1)
        assert (str(peeked), peeked.dead_letter_reason, peeked.sequence_number) == ("x", "r", message.sequence_number)


def test_scheduled_message_is_invisible_until_its_time(sb: Handlers) -> None:
    with opened(sb.sender("scheduled"), sb.receiver("scheduled")) as (sender, receiver):
        at = datetime.datetime.now(UTC) + datetime.timedelta(seconds=1.5)
        [number] = sender.schedule_messages(ServiceBusMessage("via management"), at)
        sender.send_messages(ServiceBusMessage("via annotation", scheduled_enqueue_time_utc=at))
        peeked = receiver.peek_messages(5, sequence_number=1)
        assert [m.state.name for m in peeked] == ["SCHEDULED", "SCHEDULED"]
        assert peeked[0].sequence_number == number
        assert nothing_to_receive(receiver)  # 0.5 s, well before the time
        received = collect(receiver, 2)
        assert sorted(str(m) for m in received) == ["via annotation", "via management"]
        assert all(m.enqueued_time_utc is not None and m.enqueued_time_utc >= at - datetime.timedelta(seconds=1)
                   for m in received)
        for message in received:
            receiver.complete_message(message)


def test_cancelled_scheduled_message_never_arrives(sb: Handlers) -> None:
    queue = "scheduled-cancel"
    with opened(sb.sender(queue), sb.receiver(queue, receive_mode=RECEIVE_AND_DELETE)) as (sender, receiver):
        at = datetime.datetime.now(UTC) + datetime.timedelta(seconds=1)
        cancelled, kept = sender.schedule_messages([ServiceBusMessage("cancelled"), ServiceBusMessage("kept")], at)
        sender.cancel_scheduled_messages(cancelled)
        assert [m.sequence_number for m in receiver.peek_messages(5, sequence_number=1)] == [kept]
        received = collect(receiver, 1)
        assert [(str(m), m.sequence_number) for m in received] == [("kept", kept)]
        assert receiver.peek_messages(5, sequence_number=1) == []


def test_forward_to_moves_messages_into_the_target_queue(sb: Handlers) -> None:
    target = sb.receiver("forward-target", receive_mode=RECEIVE_AND_DELETE)
    with opened(sb.sender("forward-source"), target) as (sender, receiver):
        sender.send_messages(ServiceBusMessage("hop"))
        [message] = collect(receiver, 1)
        assert str(message) == "hop"
