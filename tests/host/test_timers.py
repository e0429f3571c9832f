"""Timer triggers as a singleton: of the listeners (or host processes) of one app and store, one fires each
occurrence, none while an invocation still runs, and a dead process's lock is taken over at once."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from devservers.host.process import Function
from devservers.host.protos import protos
from devservers.host.singleton import OccurrenceLock, store_scope
from devservers.host.timers import TimerListener

EVERY_SECOND = "*/1 * * * * *"
NEVER_SOON = "0 0 0 1 1 *"


def timer_function(schedule: str, *, run_on_startup: bool = False, name: str = "sweep") -> Function:
    trigger = {"type": "timerTrigger", "name": "timer", "schedule": schedule, "runOnStartup": run_on_startup}
    return Function(name=name, function_id=f"id-{name}", trigger=trigger)


class Calls:
    """A recording invoke: who ran, from when to when; each call takes ``seconds``."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds = seconds
        self.runs: list[tuple[str, float, float]] = []
        self._lock = threading.Lock()

    def invoke_as(self, who: str) -> Any:
        def invoke(function: Function, inputs: dict[str, Any], metadata: dict[str, Any]) -> Any:
            started = time.monotonic()
            time.sleep(self.seconds)
            with self._lock:
                self.runs.append((who, started, time.monotonic()))
            return protos.InvocationResponse(result=protos.StatusResult(status=protos.StatusResult.Success))
        return invoke

    def by(self, who: str) -> int:
        return sum(1 for name, _, _ in self.runs if name == who)


@pytest.fixture
def running() -> Iterator[list[TimerListener]]:
    """Listeners to stop at the end of the test."""
    started: list[TimerListener] = []
    yield started
    for listener in started:
        listener.stop()


def start(running: list[TimerListener], listener: TimerListener) -> TimerListener:
    listener.start()
    running.append(listener)
    return listener


def dues(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage().rsplit("due=", 1)[1] for r in caplog.records if " timer outcome=" in r.getMessage()]


def start_two_of_one_app(running: list[TimerListener], calls: Calls, tmp_path: Path) -> None:
    """Two hosts' listeners of one timer function on one store, as "a" and "b"."""
    for who in ("a", "b"):
        start(running, TimerListener(timer_function(EVERY_SECOND), calls.invoke_as(who),
                                     OccurrenceLock("sweep", ["store-1"], tmp_path)))


def test_two_listeners_of_one_app_and_store_fire_each_occurrence_once(
    tmp_path: Path, running: list[TimerListener], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="devservers.host")
    calls = Calls()
    start_two_of_one_app(running, calls, tmp_path)
    time.sleep(4.5)
    for listener in running:
        listener.stop()
    fired = dues(caplog)
    assert len(fired) >= 3 and len(fired) == len(set(fired)), fired  # one invocation per second, not two
    assert len(calls.runs) == len(fired)


def test_listeners_of_other_stores_or_functions_fire_independently(
    tmp_path: Path, running: list[TimerListener]
) -> None:
    calls = Calls()
    for who, name, scope in (("a", "sweep", ["store-1"]), ("b", "sweep", ["store-2"]), ("c", "report", ["store-1"])):
        start(running, TimerListener(timer_function(EVERY_SECOND, name=name), calls.invoke_as(who),
                                     OccurrenceLock(name, scope, tmp_path)))
    time.sleep(3.5)
    assert min(calls.by("a"), calls.by("b"), calls.by("c")) >= 2, calls.runs


def test_no_occurrence_fires_anywhere_while_an_invocation_still_runs(
    tmp_path: Path, running: list[TimerListener]
) -> None:
    calls = Calls(seconds=1.6)  # longer than the period: the next occurrence finds the lock held
    start_two_of_one_app(running, calls, tmp_path)
    time.sleep(5.0)
    for listener in running:
        listener.stop()
    runs = sorted(calls.runs, key=lambda run: run[1])
    assert len(runs) >= 2
    assert all(later[1] >= earlier[2] for earlier, later in itertools.pairwise(runs)), runs


def test_run_on_startup_fires_in_each_process_as_it_starts(tmp_path: Path, running: list[TimerListener]) -> None:
    calls = Calls()
    for who in ("a", "b"):
        start(running, TimerListener(timer_function(NEVER_SOON, run_on_startup=True), calls.invoke_as(who),
                                     OccurrenceLock("sweep", ["store-1"], tmp_path)))
        deadline = time.monotonic() + 5
        while not calls.by(who) and time.monotonic() < deadline:
            time.sleep(0.02)
    assert (calls.by("a"), calls.by("b")) == (1, 1)


def test_the_lock_of_a_killed_process_is_taken_over_at_once(tmp_path: Path) -> None:
    lock = OccurrenceLock("sweep", ["store-1"], tmp_path)
    now = datetime.now(UTC).replace(microsecond=0)
    hold = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT);"
            " fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(lock.path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with lock.claim(now, now) as mine:
            assert not mine  # its invocation is still running
        holder.kill()
        holder.wait(10)
        with lock.claim(now, now) as mine:
            assert mine
        with lock.claim(now, now) as mine:
            assert not mine  # fired already
    finally:
        holder.kill()
        holder.wait(10)


def test_the_scope_is_the_storage_the_host_id_and_the_cosmos_lease_stores(tmp_path: Path) -> None:
    feed = Function(name="publish", function_id="id-publish", trigger={
        "type": "cosmosDBTrigger", "connection": "CosmosDBConnection", "databaseName": "sales",
        "containerName": "orders", "leaseContainerName": "leases"})
    settings = {"AzureWebJobsStorage": "UseDevelopmentStorage=true",
                "CosmosDBConnection": "AccountEndpoint=http://127.0.0.1:8081/;AccountKey=secret;"}
    scope = store_scope(settings, [timer_function(EVERY_SECOND), feed])
    assert scope == ["UseDevelopmentStorage=true", "", "http://127.0.0.1:8081/|sales|leases"]
    assert "secret" not in "".join(scope)
    other_database = store_scope(settings, [Function(name="publish", function_id="id", trigger={
        **feed.trigger, "databaseName": "sales-2"})])
    other_host = store_scope({**settings, "AzureFunctionsWebHost__hostid": "app-2"}, [feed])
    paths = {OccurrenceLock("sweep", s, tmp_path).path for s in (scope, other_database, other_host)}
    assert len(paths) == 3
    # With a host ID, Azure's scope: storage and host ID, whatever address each process reaches Cosmos DB by
    # (the chaos suite's hosts each go through a proxy of their own).
    behind_proxy = {**settings, "AzureFunctionsWebHost__hostid": "app-2",
                    "CosmosDBConnection": "AccountEndpoint=http://127.0.0.1:9999/;AccountKey=secret;"}
    assert store_scope(behind_proxy, [feed]) == other_host == ["UseDevelopmentStorage=true", "app-2"]
