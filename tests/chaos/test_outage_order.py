"""The outages after the first wait for the rolled-back host to be forward again.

The release before has no delayed retries: an outage while it runs (a Cosmos DB outage once) spins its deliveries
through their MaxDeliveryCount (abandoned after a second's wait in the lock, ten times), which a full run once showed
as 234 dead letters. The rollback is there to meet copies, not outages, so the outage phase holds every outage after
the first back until the rollback is over.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from chaos.faults import Chaos, Slot


class Dependency:
    """A fault proxy or stand-in that records when it was taken down."""

    def __init__(self, name: str, downs: list[str]) -> None:
        self.name, self.downs = name, downs

    def outage(self, seconds: float) -> None:
        self.downs.append(self.name)


class Stack:
    def __init__(self, downs: list[str]) -> None:
        self.fulfilment = Dependency("fulfilment", downs)


def test_the_cosmos_outage_begins_only_once_the_rolled_back_host_is_forward_again(tmp_path: Path) -> None:
    downs: list[str] = []
    stack: Any = Stack(downs)
    chaos = Chaos(stack, 1, tmp_path)
    slot = Slot(0, None, None, tmp_path / "settings.json", tmp_path)  # type: ignore[arg-type]
    slot.cosmos = Dependency("cosmos", downs)  # type: ignore[assignment]
    chaos.slots = [slot]
    phase = chaos.outage_phase([("fulfilment", 0.0), ("cosmos", 0.0)], first_after=0.0, gap=0.0,
                               after_rollback=chaos.rolled_forward)
    deadline = time.time() + 5
    while not downs and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert downs == ["fulfilment"]  # the rollback is not over: Cosmos DB stays up
    chaos.rolled_forward.set()
    phase.join(5)
    assert downs == ["fulfilment", "cosmos"] and not phase.is_alive()


def test_a_rollback_that_fails_still_lets_the_outages_go_on(tmp_path: Path) -> None:
    stack: Any = object()  # no start_host: the rollback's replacement raises
    chaos = Chaos(stack, 1, tmp_path)
    chaos.slots = [Slot(0, None, None, tmp_path / "settings.json", tmp_path)]  # type: ignore[arg-type]
    failed = threading.Event()

    def roll_back() -> None:
        try:
            chaos.rollback(tmp_path, 0.0)
        except AttributeError:
            failed.set()

    thread = threading.Thread(target=roll_back)
    thread.start()
    thread.join(5)
    assert failed.is_set() and chaos.rolled_forward.is_set()


def test_an_outage_this_stack_cannot_have_is_refused_before_anything_starts(tmp_path: Path) -> None:
    downs: list[str] = []
    stack: Any = Stack(downs)  # no identity endpoint
    chaos = Chaos(stack, 1, tmp_path)
    for plan in ([("fulfilment", 0.0), ("identity", 0.0)], [("fulfilment", 0.0), ("dns", 0.0)]):
        with pytest.raises(ValueError, match="no outage of kind"):
            chaos.outage_phase(plan, first_after=0.0, gap=0.0)
    assert downs == [] and chaos.outages == []


def test_the_not_allowed_storm_answers_401_then_403_and_is_recorded_once_begun(tmp_path: Path) -> None:
    statuses: list[int] = []

    class Fulfilment:
        def outage(self, seconds: float, status: int = 503) -> None:
            statuses.append(status)

    stack: Any = type("Stack", (), {"fulfilment": Fulfilment(), "identity": None})()
    chaos = Chaos(stack, 1, tmp_path)
    chaos.outage_phase([("not-allowed", 0.2)], first_after=0.0, gap=0.0).join(5)
    assert statuses == [401, 403]
    [outage] = chaos.outages
    assert (outage.dependency, outage.answered) == ("fulfilment", "401, then 403")
