"""A chosen kill is taken by an exchange on behalf of an order that has met fewer than KILLS_PER_ORDER of them: as a
run drains, its last few messages would otherwise meet every kill, until one is dead-lettered for ten crashes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from chaos import faults
from chaos.faults import Armed, Chaos, Moment


def _chaos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Chaos, list[tuple[int, Moment]]]:
    chaos = Chaos(object(), 1, tmp_path)  # type: ignore[arg-type]
    chaos.slots = [object(), object()]  # type: ignore[list-item]
    killed: list[tuple[int, Moment]] = []
    monkeypatch.setattr(chaos, "_kill", lambda slot, moment, worker_only: killed.append(
        (chaos.slots.index(slot), moment)))
    return chaos, killed


def _arm(chaos: Chaos, moment: Moment) -> None:
    chaos._armed = Armed(moment, worker_only=True, until=time.monotonic() + 60)


def _batch(order: str) -> dict[str, str]:
    return {"x-ms-cosmos-is-batch-request": "True", "x-ms-documentdb-partitionkey": json.dumps([order])}


def test_an_order_meets_at_most_its_share_of_chosen_kills_and_the_moment_waits_for_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chaos, killed = _chaos(tmp_path, monkeypatch)
    cosmos = chaos._cosmos_tap(0)
    for _ in range(faults.KILLS_PER_ORDER):
        _arm(chaos, Moment.BEFORE_WRITE)
        assert cosmos("POST", "/dbs/d/colls/c/docs", _batch("ord-1"), b"[]", None)
    _arm(chaos, Moment.BEFORE_WRITE)
    assert not cosmos("POST", "/dbs/d/colls/c/docs", _batch("ord-1"), b"[]", None)  # its share is met
    assert chaos._armed is not None  # still armed: the next order's write takes it, on whichever slot
    assert chaos._cosmos_tap(1)("POST", "/dbs/d/colls/c/docs", _batch("ord-2"), b"[]", None)
    assert killed == [(0, Moment.BEFORE_WRITE)] * faults.KILLS_PER_ORDER + [(1, Moment.BEFORE_WRITE)]


def test_a_fulfilment_call_counts_for_the_order_it_is_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chaos, killed = _chaos(tmp_path, monkeypatch)
    chaos._killed_for["ord-1"] = faults.KILLS_PER_ORDER
    fulfilment: Any = chaos._fulfilment_tap(0)
    _arm(chaos, Moment.FULFILMENT)
    assert not fulfilment("POST", "/reservations", {}, json.dumps({"orderId": "ord-1"}).encode(), 201)
    assert fulfilment("POST", "/reservations", {}, json.dumps({"orderId": "ord-3"}).encode(), 201)
    assert killed == [(0, Moment.FULFILMENT)] and chaos._killed_for["ord-3"] == 1


def test_an_exchange_that_names_no_order_takes_the_moment_uncounted(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    chaos, killed = _chaos(tmp_path, monkeypatch)
    _arm(chaos, Moment.BEFORE_WRITE)
    assert chaos._cosmos_tap(0)("POST", "/dbs/d/colls/c/docs", {"x-ms-cosmos-is-batch-request": "true"}, b"[]", None)
    assert killed == [(0, Moment.BEFORE_WRITE)] and not chaos._killed_for
