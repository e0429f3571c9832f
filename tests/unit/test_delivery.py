"""run_delivery's own rules, with a recording stand-in for the binding's message actions: the wait
inside the lock before an abandon, a cancelled delivery, and a settlement call that fails."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from consumers.delivery import run_delivery
from consumers.settlement import Action
from shared.domain.messages import InboundMessage
from shared.domain.outcomes import LOCK_MARGIN_SECONDS, Outcome, Result
from tests.support.fake_host import make_received_message


class Actions:
    """The three settlement calls, recorded; ``fail`` makes each raise, as a lost lock does."""

    def __init__(self, *, fail: bool = False) -> None:
        self.calls: list[str] = []
        self.fail = fail

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.fail:
            raise RuntimeError("lock lost")

    def complete(self, message: Any) -> None:
        self._call("complete")

    def abandon(self, message: Any) -> None:
        self._call("abandon")

    def deadletter(self, message: Any, deadletter_reason: str | None = None,
                   deadletter_error_description: str | None = None) -> None:
        self._call("deadletter")


def _answer(outcome: Outcome) -> Any:
    async def handler(message: InboundMessage) -> Result:
        return Result(outcome, "")
    return handler


def _silent(*_: object) -> None:
    pass


def test_a_transient_outcome_waits_inside_its_lock_then_abandons() -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    actions = Actions()
    msg = make_received_message(b"{}", message_id="m-1", locked_until=datetime.now(UTC) + timedelta(seconds=60))
    settled = asyncio.run(run_delivery("process_order", msg, actions, _answer(Outcome.TRANSIENT), abandon_delay=10,
                                       record=_silent, sleep=sleep))
    assert settled.action is Action.ABANDON and actions.calls == ["abandon"]
    assert waits == [10]  # the whole delay fits in the lock, so all of it is waited, before the abandon


def test_the_wait_is_cut_short_before_the_lock_runs_out() -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    msg = make_received_message(b"{}", message_id="m-1", locked_until=datetime.now(UTC) + timedelta(seconds=7))
    asyncio.run(run_delivery("process_order", msg, Actions(), _answer(Outcome.TRANSIENT), abandon_delay=10,
                             record=_silent, sleep=sleep))
    [waited] = waits
    assert 0 < waited <= 7 - LOCK_MARGIN_SECONDS


def test_a_completed_outcome_does_not_wait() -> None:
    async def sleep(seconds: float) -> None:
        raise AssertionError("only an abandon waits")

    actions = Actions()
    asyncio.run(run_delivery("process_order", make_received_message(b"{}", message_id="m-1"), actions,
                             _answer(Outcome.CREATED), abandon_delay=10, record=_silent, sleep=sleep))
    assert actions.calls == ["complete"]


def test_a_cancelled_delivery_is_not_settled_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    # Only a stopping worker cancels; the lock then runs out and the broker redelivers, as after a crash.
    async def handler(message: InboundMessage) -> Result:
        raise asyncio.CancelledError

    actions = Actions()
    with caplog.at_level(logging.WARNING), pytest.raises(asyncio.CancelledError):
        asyncio.run(run_delivery("process_order", make_received_message(b"{}", message_id="m-1"), actions, handler,
                                 record=_silent))
    assert actions.calls == []
    assert any("m-1 cancelled before its settlement" in r.getMessage() for r in caplog.records)


def test_a_failed_settlement_is_logged_with_its_ids_and_raised(caplog: pytest.LogCaptureFixture) -> None:
    actions = Actions(fail=True)
    with caplog.at_level(logging.ERROR), pytest.raises(RuntimeError):
        asyncio.run(run_delivery("process_order", make_received_message(b"{}", message_id="m-1"), actions,
                                 _answer(Outcome.DUPLICATE), record=_silent))
    assert actions.calls == ["complete"]  # one call, not retried
    assert any(r.getMessage() == "settlement complete failed messageId=m-1 outcome=duplicate" for r in caplog.records)
