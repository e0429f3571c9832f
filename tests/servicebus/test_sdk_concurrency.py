"""One SDK handler used from several threads at once, as AutoLockRenewer and a Functions host use it.

The SDK (7.15, pyamqp) numbers transfers without a lock: threads sharing a connection send
transfers with repeated and out-of-order delivery-ids on one AMQP session (on one link, even). Service
Bus takes them as they come; the broker must too, and must not close the connection.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable

from azure.servicebus import AutoLockRenewer, ServiceBusMessage, ServiceBusReceivedMessage

from tests.servicebus.conftest import Handlers, collect, opened, wait_for

THREADS = 10


def _run_in_threads(count: int, work: Callable[[int], None]) -> list[BaseException]:
    """Start ``count`` threads together on ``work(index)``; the exceptions they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def run(index: int) -> None:
        try:
            start.wait()
            work(index)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return errors


def _locked_until(message: ServiceBusReceivedMessage) -> datetime.datetime:
    assert message.locked_until_utc is not None
    return message.locked_until_utc


def test_auto_lock_renewer_with_eight_workers_renews_ten_messages_on_one_receiver(sb: Handlers) -> None:
    failures: list[BaseException | None] = []

    def on_failure(_renewable: object, error: BaseException | None) -> None:
        failures.append(error)

    with opened(sb.sender("concurrent-renew"), sb.receiver("concurrent-renew")) as (sender, receiver):
        sender.send_messages([ServiceBusMessage(f"m-{index}") for index in range(10)])
        messages = collect(receiver, 10)
        assert len(messages) == 10
        renewer = AutoLockRenewer(max_lock_renewal_duration=30, on_lock_renew_failure=on_failure, max_workers=8)
        try:
            for message in messages:
                renewer.register(receiver, message)
            # The lock is PT8S, so the renewer renews each lock when about 5 s remain (its heuristic
            # for short locks): eight threads renew the ten locks together, every 3 s or so, with
            # seconds to spare on a loaded machine. Wait until every first lock has run out and every
            # message holds a renewed one.
            first = {message.lock_token: _locked_until(message) for message in messages}
            last_first = max(first.values())

            def renewed() -> bool:
                assert failures == []  # at once, with the renewer's error
                return datetime.datetime.now(datetime.UTC) > last_first and all(
                    _locked_until(m) > first[m.lock_token] + datetime.timedelta(seconds=2) for m in messages
                )

            wait_for(renewed, timeout=20)
        finally:
            renewer.close()
        assert failures == []
        for message in messages:  # the first locks are long gone: this works only on renewed locks
            receiver.complete_message(message)
        assert receiver.peek_messages(10, sequence_number=1) == []


def test_ten_threads_peeking_on_one_receiver_all_get_their_answers(sb: Handlers) -> None:
    with opened(sb.sender("concurrent-peek"), sb.receiver("concurrent-peek")) as (sender, receiver):
        sender.send_messages([ServiceBusMessage(f"m-{index}") for index in range(3)])
        answers: list[list[str]] = []

        def peek(_index: int) -> None:
            for _ in range(5):
                answers.append([str(m) for m in receiver.peek_messages(3, sequence_number=1)])

        errors = _run_in_threads(THREADS, peek)
        assert errors == []
        assert answers == [["m-0", "m-1", "m-2"]] * (THREADS * 5)
        # The connection survived: the receiver still works.
        [message] = collect(receiver, 1)
        receiver.complete_message(message)
