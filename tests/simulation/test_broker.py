"""The simulated broker behaves as Service Bus does where the consumer's guarantees depend on it."""

from __future__ import annotations

import random

import pytest

from idempotent_consumer.delivery import Action
from simulation.broker import MAX_DELIVERY_COUNT_EXCEEDED, Delivery, LockLost, Queue, State
from simulation.scheduler import Clock, Scheduler, Signal


def make_queue(clock: Clock, *, sessions: bool = False, max_deliveries: int = 10) -> Queue:
    scheduler = Scheduler(random.Random(0), clock)
    return Queue("q", scheduler, Signal(), Signal(), sessions=sessions, lock_seconds=60, max_deliveries=max_deliveries,
                 detection_window=600)


def send(queue: Queue, message_id: str, session_id: str | None = None) -> None:
    queue.send(message_id=message_id, body=b"{}", session_id=session_id, correlation_id=None, tag=0)


def receive(queue: Queue, receiver: int) -> Delivery:
    delivery = queue.receive(receiver)
    assert delivery is not None
    return delivery


def test_a_message_id_sent_again_inside_the_detection_window_is_dropped_and_past_it_is_accepted() -> None:
    clock = Clock()
    queue = make_queue(clock)
    send(queue, "m")
    clock.now += 599
    send(queue, "m")
    clock.now += 2
    send(queue, "m")
    assert (len(queue.messages), queue.dropped) == (2, 1)
    assert [m.sequence_number for m in queue.messages] == [1, 2]


def test_a_lock_that_runs_out_redelivers_the_message_and_the_old_delivery_cannot_settle() -> None:
    clock = Clock()
    queue = make_queue(clock)
    send(queue, "m")
    old = receive(queue, 1)
    clock.now += 60
    new = receive(queue, 2)
    assert new.message is old.message and new.message.deliveries == 2
    with pytest.raises(LockLost):
        queue.settle(old, Action.COMPLETE, None, None)
    queue.settle(new, Action.COMPLETE, None, None)
    assert new.message.state is State.COMPLETED


def test_a_redelivery_keeps_its_sequence_number_and_counts_prior_deliveries() -> None:
    clock = Clock()
    queue = make_queue(clock)
    send(queue, "m")
    first = receive(queue, 1)
    queue.settle(first, Action.ABANDON, None, None)
    second = receive(queue, 1).inbound(clock)
    assert (second.sequence_number, second.delivery_count) == (1, 1)


def test_the_delivery_after_max_delivery_count_dead_letters_the_message() -> None:
    clock = Clock()
    queue = make_queue(clock, max_deliveries=2)
    send(queue, "m")
    queue.settle(receive(queue, 1), Action.ABANDON, None, None)
    queue.settle(receive(queue, 1), Action.ABANDON, None, None)
    assert queue.receive(1) is None
    assert (queue.messages[0].state, queue.messages[0].reason) == (State.DEAD_LETTERED, MAX_DELIVERY_COUNT_EXCEEDED)


def test_a_session_is_held_by_one_receiver_and_delivers_in_sequence_even_after_an_abandon() -> None:
    clock = Clock()
    queue = make_queue(clock, sessions=True)
    for message_id in ("a", "b"):
        send(queue, message_id, session_id="s")
    first = receive(queue, 1)
    assert queue.receive(2) is None
    queue.settle(first, Action.ABANDON, None, None)
    assert receive(queue, 1).message.message_id == "a"


def test_a_session_whose_lock_ran_out_passes_to_another_receiver_with_its_head_message() -> None:
    clock = Clock()
    queue = make_queue(clock, sessions=True)
    for message_id in ("a", "b"):
        send(queue, message_id, session_id="s")
    stale = receive(queue, 1)
    clock.now += 61
    taken = receive(queue, 2)
    assert taken.message.message_id == "a" and taken.message.deliveries == 2
    with pytest.raises(LockLost):
        queue.settle(stale, Action.COMPLETE, None, None)
    queue.settle(taken, Action.COMPLETE, None, None)
    assert receive(queue, 2).message.message_id == "b"


def test_a_session_let_go_mid_processing_passes_at_once_to_another_receiver_while_the_first_delivery_runs() -> None:
    clock = Clock()
    queue = make_queue(clock, sessions=True)
    for message_id in ("a", "b"):
        send(queue, message_id, session_id="s")
    first = receive(queue, 1)
    assert queue.release_session(first)
    parallel = receive(queue, 2)  # no lock had to run out: the same message, in parallel with the first
    # The session's close did not count the first delivery: this one is counted as the first again.
    assert parallel.message.message_id == "a" and parallel.message.deliveries == 1
    with pytest.raises(LockLost):
        queue.settle(first, Action.COMPLETE, None, None)
    assert not queue.release_session(first)  # it holds nothing any more
    queue.settle(parallel, Action.COMPLETE, None, None)
    assert receive(queue, 2).message.message_id == "b"


def test_a_plain_queue_has_no_session_to_let_go() -> None:
    queue = make_queue(Clock())
    send(queue, "a")
    assert not queue.release_session(receive(queue, 1))
