"""``python -m bench.operations``: every path walked on the local Cosmos server with the real SDK, its requests
and operations counted on the wire, and the design's promises checked."""

from __future__ import annotations

import json

import pytest

from bench import operations


@pytest.fixture(scope="module")
def paths() -> dict[str, operations.Path]:
    import asyncio  # noqa: PLC0415 - one walk for the module

    return asyncio.run(operations.measure())


def test_each_path_sends_what_the_design_promises(paths: dict[str, operations.Path]) -> None:
    assert operations.broken_promises(paths) == []
    new, event = paths["new order"], paths["captured payment"]
    # The consumer's two requests per new order and per event (the floor the bench asserts), and the publisher's
    # delete of the sent outbox entry.
    assert [r for r in new.requests if "delete" not in r] == ["batch: create, create", "batch: patch, create, patch"]
    assert len(event.requests) == 2 and not new.refused and not event.refused
    assert new.bytes_out > 0 and new.bytes_in > 0
    # Refused operations by status: a copy's batch (409), an early event's (412), an event before its order (404).
    assert paths["copy of a finished order"].refused == {409: 2}
    assert paths["early event, parked"].refused == {412: 2}
    assert paths["event before its order, parked"].refused == {404: 3}
    assert paths["outbox sweep, per run"].requests == ["query page"]


def test_a_path_that_sends_more_than_promised_is_named(paths: dict[str, operations.Path]) -> None:
    planted = dict(paths)
    planted["new order"] = operations.Path(requests=[*paths["new order"].requests, "read"])
    [problem] = operations.broken_promises(planted)
    assert problem.startswith("new order: sent [") and "'read'" in problem and "the design promises" in problem


def test_the_command_checks_and_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert operations.main(["--check", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["new order"]["operations"] == {"create in a batch": 3, "patch in a batch": 2,
                                                  "delete in a batch": 1}
