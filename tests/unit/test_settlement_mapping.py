"""A pin of an interface: the outcome -> settlement table in ``idempotent_consumer.delivery``, written out again here.

The table is the one place that maps outcomes to complete, abandon or dead-letter, and its dead-letter
reasons are the exact strings operators alert on and runbooks name. Retyping it is the point: a change
to the table fails here first, so that it is made on purpose and announced, not slipped in.
"""

from __future__ import annotations

from idempotent_consumer.delivery import SETTLEMENTS, Action, Settlement
from idempotent_consumer.outcomes import Outcome


def test_every_outcome_has_a_settlement() -> None:
    assert set(SETTLEMENTS) == set(Outcome)


def test_outcomes_map_to_the_documented_settlements() -> None:
    assert {
        Outcome.CREATED: Settlement(Action.COMPLETE),
        Outcome.APPLIED: Settlement(Action.COMPLETE),
        Outcome.DUPLICATE: Settlement(Action.COMPLETE),
        Outcome.STALE: Settlement(Action.COMPLETE),
        Outcome.PAYLOAD_MISMATCH: Settlement(Action.DEADLETTER, "PayloadMismatch"),
        Outcome.UNREADABLE: Settlement(Action.DEADLETTER, "UnreadableDocument"),
        Outcome.INVALID: Settlement(Action.DEADLETTER, "InvalidMessage"),
        Outcome.INVALID_TRANSITION: Settlement(Action.DEADLETTER, "InvalidTransition"),
        Outcome.LIMIT_EXCEEDED: Settlement(Action.DEADLETTER, "LimitExceeded"),
        Outcome.INVALID_PLAN: Settlement(Action.DEADLETTER, "InvalidPlan"),
        Outcome.PARKED: Settlement(Action.COMPLETE),
        Outcome.REJECTED: Settlement(Action.COMPLETE),
        Outcome.ORDER_CLOSED: Settlement(Action.COMPLETE),
        Outcome.IN_PROGRESS: Settlement(Action.COMPLETE),
        Outcome.DOWNSTREAM_REJECTED: Settlement(Action.DEADLETTER, "DownstreamRejected"),
        Outcome.TRANSIENT: Settlement(Action.ABANDON),
        Outcome.HANDED_ON: Settlement(Action.COMPLETE),
        Outcome.RETRY_LIMIT_EXCEEDED: Settlement(Action.DEADLETTER, "RetryLimitExceeded"),
        Outcome.ERROR: Settlement(Action.ABANDON),
    } == SETTLEMENTS


def test_only_dead_letters_carry_a_reason() -> None:
    for settlement in SETTLEMENTS.values():
        assert (settlement.reason is not None) == (settlement.action is Action.DEADLETTER)


def test_only_transient_and_error_abandon() -> None:
    abandoning = {o for o, s in SETTLEMENTS.items() if s.action is Action.ABANDON}
    assert abandoning == {Outcome.TRANSIENT, Outcome.ERROR}
