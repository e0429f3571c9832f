"""The broker's entity model on its own (no AMQP): sequence numbers, locks, delivery counts, sessions, timers.

Time is passed in explicitly, so these tests run instantly and exactly.
"""

from __future__ import annotations

from typing import Any

import pytest

from devservers.servicebus.config import load_config
from devservers.servicebus.errors import MESSAGE_SIZE_EXCEEDED
from devservers.servicebus.store import (
    MESSAGE_LOCK_LOST,
    SESSION_CANNOT_BE_LOCKED,
    SESSION_LOCK_LOST,
    BrokerError,
    Envelope,
    Namespace,
    Outcome,
    Queue,
)

T0 = 1_000_000.0


def _namespace(**queue_properties: Any) -> Namespace:
    document = {
        "UserConfig": {"Namespaces": [{"Name": "ns", "Queues": [{"Name": "q", "Properties": queue_properties}]}]}
    }
    return Namespace(load_config(document))


def _queue(**queue_properties: Any) -> Queue:
    return _namespace(**queue_properties).queues["q"]


def _envelope(message_id: str | None = None, session_id: str | None = None, **fields: Any) -> Envelope:
    return Envelope(payload=None, message_id=message_id, session_id=session_id, **fields)


OWNER = object()


def test_sequence_numbers_start_at_one_and_increase() -> None:
    queue = _queue()
    assert queue.intake.send([_envelope(), _envelope()], T0) == [1, 2]
    assert queue.intake.send([_envelope()], T0) == [3]


def test_delivery_count_counts_deliveries_and_header_shows_prior_attempts() -> None:
    queue = _queue(MaxDeliveryCount=5)
    queue.intake.send([_envelope()], T0)
    message = queue.next_message(OWNER, T0, peek_lock=True)
    assert message is not None and (message.delivery_count, message.header_delivery_count()) == (1, 0)
    assert message.lock_token is not None
    queue.settle(message.lock_token, Outcome.ABANDON, T0)
    assert message.header_delivery_count() == 1  # as peek shows it: one failed attempt
    again = queue.next_message(OWNER, T0, peek_lock=True)
    assert again is message and message.header_delivery_count() == 1


def test_receive_and_delete_delivery_shows_no_prior_attempts() -> None:
    queue = _queue()
    queue.intake.send([_envelope()], T0)
    message = queue.next_message(OWNER, T0, peek_lock=False)
    assert message is not None and not message.locked and queue.messages == {}
    assert message.header_delivery_count(delivering=True) == 0


def test_release_does_not_count_as_a_failed_delivery() -> None:
    queue = _queue()
    queue.intake.send([_envelope()], T0)
    message = queue.next_message(OWNER, T0, peek_lock=True)
    assert message is not None and message.lock_token is not None
    queue.settle(message.lock_token, Outcome.RELEASE, T0)
    assert message.delivery_count == 0


def test_lock_expiry_returns_the_message_and_loses_the_lock() -> None:
    queue = _queue(LockDuration="PT10S", MaxDeliveryCount=5)
    queue.intake.send([_envelope()], T0)
    message = queue.next_message(OWNER, T0, peek_lock=True)
    assert message is not None and message.lock_token is not None
    token = message.lock_token
    assert queue.next_message(OWNER, T0 + 9.9, peek_lock=True) is None
    assert queue.next_message(OWNER, T0 + 10, peek_lock=True) is message
    with pytest.raises(BrokerError) as lost:
        queue.settle(token, Outcome.COMPLETE, T0 + 10)
    assert lost.value.condition == MESSAGE_LOCK_LOST


def test_max_delivery_count_dead_letters_on_the_last_failure() -> None:
    queue = _queue(MaxDeliveryCount=2)
    queue.intake.send([_envelope()], T0)
    for _ in range(2):
        message = queue.next_message(OWNER, T0, peek_lock=True)
        assert message is not None and message.lock_token is not None
        queue.settle(message.lock_token, Outcome.ABANDON, T0)
    assert queue.messages == {}
    assert queue.dead_letter_queue is not None
    [dead] = queue.dead_letter_queue.messages.values()
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert dead.dead_letter_description == "Message could not be consumed after 2 delivery attempts."
    assert dead.sequence_number == 1 and dead.expires_at is None


def test_duplicate_window_is_fixed_from_the_first_send() -> None:
    queue = _queue(RequiresDuplicateDetection=True, DuplicateDetectionHistoryTimeWindow="PT10S")
    assert queue.intake.send([_envelope("a")], T0) == [1]
    assert queue.intake.send([_envelope("a")], T0 + 5) == [0]  # dropped, window not restarted
    assert queue.intake.send([_envelope("a")], T0 + 10) == [2]
    assert queue.intake.send([_envelope(None), _envelope(None)], T0 + 10) == [3, 4]  # no id: never a duplicate


def test_ttl_is_capped_by_the_entity_default_and_expired_messages_are_removed() -> None:
    queue = _queue(DefaultMessageTimeToLive="PT10S")
    queue.intake.send([_envelope(ttl=60.0), _envelope(ttl=5.0)], T0)
    assert [m.ttl for m in queue.messages.values()] == [10.0, 5.0]
    assert [m.sequence_number for m in queue.browser.peek(1, 10, T0 + 5)] == [1]
    assert queue.browser.peek(1, 10, T0 + 10) == []


def test_locked_message_expires_only_when_its_lock_ends() -> None:
    queue = _queue(DefaultMessageTimeToLive="PT5S", LockDuration="PT10S", DeadLetteringOnMessageExpiration=True)
    queue.intake.send([_envelope()], T0)
    message = queue.next_message(OWNER, T0, peek_lock=True)
    assert message is not None
    queue.process_timers(T0 + 6)
    assert message.locked and 1 in queue.messages
    queue.process_timers(T0 + 10)
    assert queue.messages == {}
    assert queue.dead_letter_queue is not None
    assert [m.dead_letter_reason for m in queue.dead_letter_queue.messages.values()] == ["TTLExpiredException"]


def test_scheduled_message_activates_at_its_time_and_can_be_cancelled() -> None:
    queue = _queue()
    [kept, cancelled] = queue.intake.send(
        [_envelope(scheduled_enqueue_time=T0 + 5), _envelope(scheduled_enqueue_time=T0 + 5)], T0
    )
    queue.intake.cancel([cancelled], T0 + 1)
    assert queue.next_message(OWNER, T0 + 4.9, peek_lock=False) is None
    message = queue.next_message(OWNER, T0 + 5, peek_lock=False)
    assert message is not None and message.sequence_number == kept and message.enqueued_time == T0 + 5
    assert queue.next_message(OWNER, T0 + 5, peek_lock=False) is None
    with pytest.raises(BrokerError):
        queue.intake.cancel([kept], T0 + 6)


def test_sessions_lock_per_receiver_and_next_available_picks_oldest() -> None:
    queue = _queue(RequiresSession=True, LockDuration="PT10S")
    queue.intake.send([_envelope(session_id="b"), _envelope(session_id="a")], T0)
    first, second = object(), object()
    session = queue.sessions.accept(None, first, T0)
    assert session is not None and session.session_id == "b"  # its message is the oldest
    with pytest.raises(BrokerError) as refused:
        queue.sessions.accept("b", second, T0)
    assert refused.value.condition == SESSION_CANNOT_BE_LOCKED
    other = queue.sessions.accept(None, second, T0)
    assert other is not None and other.session_id == "a"
    assert queue.sessions.accept(None, object(), T0) is None


def test_session_lock_expiry_releases_the_session_and_revokes_its_message_locks() -> None:
    queue = _queue(RequiresSession=True, LockDuration="PT10S", MaxDeliveryCount=5)
    queue.intake.send([_envelope(session_id="s")], T0)
    owner = object()
    session = queue.sessions.accept("s", owner, T0)
    message = queue.next_message(owner, T0, peek_lock=True, session=session)
    assert message is not None and message.lock_token is not None and message.locked_until == T0 + 10
    token = message.lock_token
    assert queue.next_message(owner, T0 + 10, peek_lock=True, session=session) is None  # noticed on access
    [lost] = queue.take_session_losses()
    assert (lost.session_id, lost.owner) == ("s", owner)
    with pytest.raises(BrokerError) as revoked:
        queue.settle(token, Outcome.COMPLETE, T0 + 10)
    assert revoked.value.condition == SESSION_LOCK_LOST
    assert message.delivery_count == 1 and not message.locked


def test_session_state_outlives_the_lock() -> None:
    queue = _queue(RequiresSession=True)
    owner = object()
    queue.sessions.accept("s", owner, T0)
    queue.sessions.set_state("s", owner, b"state", T0)
    queue.sessions.release("s", owner, T0)
    assert queue.sessions.ids() == ["s"]
    assert queue.sessions.accept("s", owner, T0 + 1) is not None
    assert queue.sessions.owned("s", owner, T0 + 1).state == b"state"


def test_sending_without_session_id_to_a_session_queue_is_refused() -> None:
    queue = _queue(RequiresSession=True)
    with pytest.raises(BrokerError, match="SessionId"):
        queue.intake.send([_envelope(session_id="ok"), _envelope()], T0)
    assert queue.messages == {}  # a batch is all or nothing


def test_a_message_over_the_entitys_size_is_refused_with_message_size_exceeded() -> None:
    intake = _queue().intake
    intake.check_size(256 * 1024)
    with pytest.raises(BrokerError) as refused:
        intake.check_size(256 * 1024 + 1)
    assert refused.value.condition == MESSAGE_SIZE_EXCEEDED
    assert "262145 bytes" in refused.value.description and "262144 bytes" in refused.value.description


def test_a_batch_is_held_to_1_mb_where_the_entity_takes_larger_messages() -> None:
    intake = _queue(MaxMessageSizeInKilobytes=2048).intake
    intake.check_size(2048 * 1024)
    intake.check_size(1024 * 1024, batch=True)
    with pytest.raises(BrokerError, match=r"limit \(1048576 bytes\)"):
        intake.check_size(1024 * 1024 + 1, batch=True)
