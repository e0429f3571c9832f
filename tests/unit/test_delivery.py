"""run_delivery's own rules, with a recording settlement port: an exception is outcome error, the wait
inside the lock before an abandon, a cancelled delivery, a settlement call that fails; and the binding's
settlement adapter, which makes the one call the settlement names."""

from __future__ import annotations

import asyncio
import logging
import threading
import types
from datetime import UTC, datetime
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from idempotent_consumer.delivery import Action, Retries, Settlement, run_delivery
from idempotent_consumer.functions.settlement import MAX_DESCRIPTION_CHARS, ActionsSettlement
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outcomes import LOCK_MARGIN_SECONDS, Outcome, Result

NOW = 1_796_083_200.0


class Port:
    """A settlement port that records each call; ``fail`` makes it raise, as a lost lock does."""

    def __init__(self, *, fail: bool = False, renewed_for: float | None = None, renew_fails: bool = False) -> None:
        self.calls: list[tuple[Settlement, Result]] = []
        self.fail = fail
        self.renewed_for, self.renew_fails, self.renewals = renewed_for, renew_fails, 0

    async def settle(self, settlement: Settlement, result: Result) -> None:
        self.calls.append((settlement, result))
        if self.fail:
            raise RuntimeError("lock lost")

    async def renew_session_lock(self) -> datetime | None:
        self.renewals += 1
        if self.renew_fails:
            raise RuntimeError("session lock lost")
        return None if self.renewed_for is None else datetime.fromtimestamp(NOW + self.renewed_for, UTC)

    def actions(self) -> list[Action]:
        return [settlement.action for settlement, _ in self.calls]


def _message(locked_for: float = 60.0, session_id: str | None = None) -> InboundMessage:
    return InboundMessage(message_id="m-1", body=b"{}", session_id=session_id,
                          locked_until_utc=datetime.fromtimestamp(NOW + locked_for, UTC))


def _answer(outcome: Outcome) -> Any:
    async def handler(message: InboundMessage) -> Result:
        return Result(outcome, "")
    return handler


def _silent(*_: object) -> None:
    pass


def _deliver(handler: Any, port: Port, *, read: Any = _message, **policy: Any) -> Settlement:
    return asyncio.run(run_delivery("process_order", read, handler, port, clock=lambda: NOW, record=_silent, **policy))


def test_each_outcome_is_settled_once_as_the_table_says() -> None:
    port = Port()
    assert _deliver(_answer(Outcome.PAYLOAD_MISMATCH), port) == Settlement(Action.DEADLETTER, "PayloadMismatch")
    assert port.actions() == [Action.DEADLETTER]


def test_an_exception_from_the_handler_is_outcome_error_named_by_its_type_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def handler(message: InboundMessage) -> Result:
        raise KeyError("customer jane.doe@example.com")

    port = Port()
    with caplog.at_level(logging.ERROR):
        settled = _deliver(handler, port)
    assert settled.action is Action.ABANDON
    [(_, result)] = port.calls
    assert result == Result(Outcome.ERROR, "unexpected KeyError")  # the exception's text may hold a payload
    assert any(r.exc_info for r in caplog.records)


def test_a_delivery_that_cannot_be_translated_is_outcome_error_too() -> None:
    def unreadable() -> InboundMessage:
        raise ValueError("not an AMQP data body")

    recorded: list[tuple[str | None, Outcome]] = []
    port = Port()
    asyncio.run(run_delivery("process_order", unreadable, _answer(Outcome.CREATED), port, clock=lambda: NOW,
                             record=lambda f, m, r, ms: recorded.append((m.message_id, r.outcome))))
    assert recorded == [(None, Outcome.ERROR)]
    assert port.actions() == [Action.ABANDON]


def test_a_transient_outcome_waits_inside_its_lock_then_abandons() -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    port = Port()
    settled = _deliver(_answer(Outcome.TRANSIENT), port, retrying=Retries(wait=10), sleep=sleep)
    assert settled.action is Action.ABANDON and port.actions() == [Action.ABANDON]
    assert waits == [10]  # the whole delay fits in the lock, so all of it is waited, before the abandon


def test_the_wait_is_cut_short_before_the_lock_runs_out_by_the_policy_clock() -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    _deliver(_answer(Outcome.TRANSIENT), Port(), read=lambda: _message(locked_for=7), retrying=Retries(wait=10),
             sleep=sleep)
    assert waits == [7 - LOCK_MARGIN_SECONDS]


def test_a_session_message_whose_lock_cannot_hold_the_wait_renews_the_session_lock_and_waits_it_all() -> None:
    # The session's messages share its lock, and the abandoned one comes straight back to this receiver:
    # abandoning at once would spend MaxDeliveryCount in a second.
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    port = Port(renewed_for=60)
    _deliver(_answer(Outcome.TRANSIENT), port, read=lambda: _message(locked_for=3, session_id="ord-1"),
             retrying=Retries(wait=10), sleep=sleep)
    assert port.renewals == 1 and waits == [10] and port.actions() == [Action.ABANDON]


@pytest.mark.parametrize(("session_id", "locked_for", "port"), [
    (None, 3, Port(renewed_for=60)),  # a plain queue's redelivery comes with a lock of its own
    ("ord-1", 60, Port(renewed_for=60)),  # the lock holds the whole wait already
])
def test_no_renewal_when_the_lock_is_the_delivery_s_own_or_holds_the_wait(session_id: str | None, locked_for: float,
                                                                           port: Port) -> None:
    async def sleep(seconds: float) -> None:
        pass

    _deliver(_answer(Outcome.TRANSIENT), port, read=lambda: _message(locked_for, session_id), retrying=Retries(wait=10),
             sleep=sleep)
    assert port.renewals == 0 and port.actions() == [Action.ABANDON]


def test_a_refused_session_renewal_keeps_the_wait_inside_the_lock_and_still_abandons(
        caplog: pytest.LogCaptureFixture) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    port = Port(renew_fails=True)
    _deliver(_answer(Outcome.TRANSIENT), port, read=lambda: _message(locked_for=7, session_id="ord-1"),
             retrying=Retries(wait=10), sleep=sleep)
    assert waits == [7 - LOCK_MARGIN_SECONDS] and port.actions() == [Action.ABANDON]
    assert "renewing the session lock before waiting failed (RuntimeError)" in caplog.text


def test_a_completed_outcome_does_not_wait() -> None:
    async def sleep(seconds: float) -> None:
        raise AssertionError("only an abandon waits")

    port = Port()
    _deliver(_answer(Outcome.CREATED), port, retrying=Retries(wait=10), sleep=sleep)
    assert port.actions() == [Action.COMPLETE]


def test_a_failing_recorder_does_not_cost_the_settlement() -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("exporter down")

    port = Port()
    asyncio.run(run_delivery("process_order", _message, _answer(Outcome.CREATED), port, record=broken))
    assert port.actions() == [Action.COMPLETE]


def test_a_cancelled_delivery_is_not_settled_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    # Only a stopping worker cancels; the lock then runs out and the broker redelivers, as after a crash.
    async def handler(message: InboundMessage) -> Result:
        raise asyncio.CancelledError

    port = Port()
    with caplog.at_level(logging.WARNING), pytest.raises(asyncio.CancelledError):
        _deliver(handler, port)
    assert port.calls == []
    assert any("m-1 cancelled before its settlement" in r.getMessage() for r in caplog.records)


def test_a_failed_settlement_is_logged_with_its_ids_and_raised(caplog: pytest.LogCaptureFixture) -> None:
    port = Port(fail=True)
    with caplog.at_level(logging.ERROR), pytest.raises(RuntimeError):
        _deliver(_answer(Outcome.DUPLICATE), port)
    assert port.actions() == [Action.COMPLETE]  # one call, not retried
    assert any(r.getMessage() == "settlement complete failed messageId=m-1 outcome=duplicate" for r in caplog.records)


# -- the binding's settlement adapter ------------------------------------------------------------------


class Actions:
    """The binding's three settlement calls, recorded with their arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def complete(self, message: Any) -> None:
        self.calls.append(("complete", message))

    def abandon(self, message: Any) -> None:
        self.calls.append(("abandon", message))

    def deadletter(self, message: Any, deadletter_reason: str | None = None,
                   deadletter_error_description: str | None = None) -> None:
        self.calls.append(("deadletter", message, deadletter_reason, deadletter_error_description))

    def renew_session_lock(self, session_id: str) -> Any:
        self.calls.append(("renew_session_lock", session_id))
        until = Timestamp()
        until.FromDatetime(datetime.fromtimestamp(NOW + 60, UTC))
        return until


@pytest.mark.parametrize(("settlement", "call"), [
    (Settlement(Action.COMPLETE), ("complete", "msg")),
    (Settlement(Action.ABANDON), ("abandon", "msg")),
    (Settlement(Action.DEADLETTER, "InvalidMessage"), ("deadletter", "msg", "InvalidMessage", "amount < 0")),
])
def test_the_adapter_makes_the_one_call_the_settlement_names(settlement: Settlement, call: tuple[Any, ...]) -> None:
    actions = Actions()
    asyncio.run(ActionsSettlement("msg", actions).settle(settlement, Result(Outcome.INVALID, "amount < 0")))
    assert actions.calls == [call]


def test_the_adapter_caps_a_dead_letter_description_and_falls_back_to_the_reason() -> None:
    actions = Actions()
    adapter = ActionsSettlement("msg", actions)
    deadletter = Settlement(Action.DEADLETTER, "InvalidMessage")
    asyncio.run(adapter.settle(deadletter, Result(Outcome.INVALID, "x" * 5000)))
    asyncio.run(adapter.settle(deadletter, Result(Outcome.INVALID, "")))
    assert [c[3] for c in actions.calls] == ["x" * MAX_DESCRIPTION_CHARS, "InvalidMessage"]


def test_the_adapter_renews_the_message_s_session_lock_through_the_host_and_reads_the_timestamp() -> None:
    actions = Actions()
    session_message = types.SimpleNamespace(session_id="ord-1")
    assert asyncio.run(ActionsSettlement(session_message, actions, sessions=True).renew_session_lock()) == \
        datetime.fromtimestamp(NOW + 60, UTC)
    assert actions.calls == [("renew_session_lock", "ord-1")]
    # On a plain queue (a SessionId set by the producer or not) there is no session lock to renew.
    assert asyncio.run(ActionsSettlement(session_message, actions).renew_session_lock()) is None
    assert asyncio.run(ActionsSettlement(types.SimpleNamespace(session_id=None), actions,
                                         sessions=True).renew_session_lock()) is None
    assert actions.calls == [("renew_session_lock", "ord-1")]


def test_the_adapter_settles_off_the_loop() -> None:
    threads: list[str] = []

    class Recording(Actions):
        def complete(self, message: Any) -> None:
            threads.append(threading.current_thread().name)

    asyncio.run(ActionsSettlement("msg", Recording()).settle(Settlement(Action.COMPLETE), Result(Outcome.CREATED)))
    assert threads and threads[0].startswith("settle")
