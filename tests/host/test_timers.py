"""Timer triggers as the Functions host runs them, against Azurite: the one host process that holds the
listener's blob lease runs the schedule; another takes over once the lease is released or expires; each start
of the listener fires a missed occurrence as past due (by the schedule status blob), else runOnStartup; each
invocation writes the status after it."""

from __future__ import annotations

import ctypes
import itertools
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.storage.blob import BlobServiceClient, ContainerClient

from devservers.azurite import Azurite
from devservers.host.core import HostConfig, SingletonOptions
from devservers.host.process import Function, HostError, failure
from devservers.host.protos import protos
from devservers.host.singleton import (
    HOST_CONTAINER,
    NEVER,
    ListenerLease,
    ScheduleMonitor,
    ScheduleStatus,
    host_id,
    stable_hash,
)
from devservers.host.timers import Schedule, TimerListener, monitor_disabled
from tests.support.azurite import azurite  # noqa: F401 - a fixture

EVERY_SECOND = "*/1 * * * * *"
HOURLY = "0 0 * * * *"
NEVER_SOON = "0 0 0 1 1 *"
# The shortest lease Azure and Azurite take; a recovery interval shorter than the host allows, to keep tests short.
FAST = SingletonOptions(listener_lock_period=15, listener_lock_recovery_polling_interval=0.5)


def timer_function(schedule: str, *, run_on_startup: bool = False, name: str = "sweep") -> Function:
    trigger = {"type": "timerTrigger", "name": "timer", "schedule": schedule, "runOnStartup": run_on_startup}
    return Function(name=name, function_id=f"id-{name}", trigger=trigger)


class Calls:
    """A recording invoke: who ran, from when to when; each call takes ``seconds``."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds = seconds
        self.runs: list[tuple[str, float, float]] = []
        self.timer_infos: list[str] = []
        self._lock = threading.Lock()

    def invoke_as(self, who: str) -> Any:
        def invoke(function: Function, inputs: dict[str, Any], metadata: dict[str, Any]) -> Any:
            started = time.monotonic()
            time.sleep(self.seconds)
            with self._lock:
                self.runs.append((who, started, time.monotonic()))
                self.timer_infos.append(inputs["timer"].json)
            return protos.InvocationResponse(result=protos.StatusResult(status=protos.StatusResult.Success))
        return invoke

    def by(self, who: str) -> int:
        return sum(1 for name, _, _ in self.runs if name == who)

    def infos(self) -> list[dict[str, Any]]:
        return [json.loads(info) for info in self.timer_infos]


@pytest.fixture
def container(azurite: Azurite) -> ContainerClient:  # noqa: F811 - the fixture
    return BlobServiceClient.from_connection_string(azurite.connection_string).get_container_client(HOST_CONTAINER)


@pytest.fixture
def app() -> str:
    """A host ID of its own per test: one app."""
    return f"app-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def running() -> Iterator[list[TimerListener]]:
    """Listeners to stop at the end of the test."""
    started: list[TimerListener] = []
    yield started
    for listener in started:
        listener.stop()


def listener(container: ContainerClient, app: str, who: str, calls: Calls, function: Function,
             options: SingletonOptions = FAST, clock: Any = None) -> TimerListener:
    lease = ListenerLease(container, app, function.name, options.listener_lock_period)
    extra = {"clock": clock} if clock else {}
    return TimerListener(function, calls.invoke_as(who), lease, ScheduleMonitor(container, app, function.name),
                         options, **extra)


def start(running: list[TimerListener], timer: TimerListener) -> TimerListener:
    timer.start()
    running.append(timer)
    return timer


def eventually(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout} s")
        time.sleep(0.05)


def test_of_two_listeners_of_one_app_only_the_lease_holder_fires_and_each_occurrence_once(
    container: ContainerClient, app: str, running: list[TimerListener]
) -> None:
    calls = Calls()
    for who in ("a", "b"):
        start(running, listener(container, app, who, calls, timer_function(EVERY_SECOND)))
    eventually(lambda: len(calls.runs) >= 3, 10, "three occurrences")
    for timer in running:
        timer.stop()
    assert {who for who, _, _ in calls.runs} in ({"a"}, {"b"}), calls.runs
    lease = container.get_blob_client(f"locks/{app}/Host.Functions.sweep.Listener").get_blob_properties().lease
    assert lease.state == "available"  # released by the stopped holder


def test_listeners_of_other_apps_or_functions_fire_independently(
    container: ContainerClient, running: list[TimerListener]
) -> None:
    calls = Calls()
    for who, name, app in (("a", "sweep", "app-1"), ("b", "sweep", "app-2"), ("c", "report", "app-1")):
        start(running, listener(container, f"{app}-{uuid.uuid4().hex[:6]}", who, calls,
                                timer_function(EVERY_SECOND, name=name)))
    eventually(lambda: min(calls.by("a"), calls.by("b"), calls.by("c")) >= 2, 10, "two runs of each")


def test_no_occurrence_fires_while_an_invocation_still_runs(
    container: ContainerClient, app: str, running: list[TimerListener]
) -> None:
    calls = Calls(seconds=1.6)  # longer than the period
    for who in ("a", "b"):
        start(running, listener(container, app, who, calls, timer_function(EVERY_SECOND)))
    eventually(lambda: len(calls.runs) >= 2, 10, "two runs")
    for timer in running:
        timer.stop()
    runs = sorted(calls.runs, key=lambda run: run[1])
    assert all(later[1] >= earlier[2] for earlier, later in itertools.pairwise(runs)), runs


def test_run_on_startup_fires_where_the_listener_starts_the_holder_at_start_and_the_next_on_a_takeover(
    container: ContainerClient, app: str, running: list[TimerListener]
) -> None:
    calls = Calls()
    first = start(running, listener(container, app, "a", calls, timer_function(NEVER_SOON, run_on_startup=True)))
    eventually(lambda: calls.by("a") == 1, 5, "a's startup run")
    start(running, listener(container, app, "b", calls, timer_function(NEVER_SOON, run_on_startup=True)))
    time.sleep(1.5)
    assert calls.by("b") == 0  # a holds the lease: b does not listen
    first.stop()  # releases it; b takes it at its next try, and starts listening
    eventually(lambda: calls.by("b") == 1, 5, "b's run on its takeover")


def test_a_lease_left_by_a_dead_holder_is_taken_once_it_expires(
    container: ContainerClient, app: str, running: list[TimerListener]
) -> None:
    dead = ListenerLease(container, app, "sweep", 15)
    assert dead.acquire()  # and never renewed, as by a process killed at once
    taken = time.monotonic()
    calls = Calls()
    start(running, listener(container, app, "b", calls, timer_function(EVERY_SECOND)))
    eventually(lambda: calls.by("b") >= 1, 20, "b's first run")
    waited = time.monotonic() - taken
    assert 14 <= waited <= 15 + FAST.listener_lock_recovery_polling_interval + 2.5, waited


def test_a_missed_occurrence_fires_at_once_as_past_due_and_the_status_is_written_after_it(
    container: ContainerClient, app: str, running: list[TimerListener]
) -> None:
    monitor = ScheduleMonitor(container, app, "sweep")
    now = datetime.now(UTC)
    last = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    monitor.update(ScheduleStatus(last, last + timedelta(hours=1), last))
    calls = Calls()
    start(running, listener(container, app, "a", calls, timer_function(HOURLY)))
    eventually(lambda: calls.by("a") == 1, 5, "the past-due run")
    [info] = calls.infos()
    assert info["IsPastDue"] is True
    assert ScheduleStatus.from_json(info["ScheduleStatus"]).next == last + timedelta(hours=1)
    eventually(lambda: (monitor.status() or ScheduleStatus(NEVER, NEVER, NEVER)).last > now, 5, "the status written")
    status = monitor.status()
    assert status is not None and status.next == Schedule(HOURLY).next_after(status.last)
    assert monitor.name == f"timers/{app}/Host.Functions.sweep/status"


def test_a_status_left_by_another_schedule_is_reset_and_not_past_due(
    container: ContainerClient, app: str, running: list[TimerListener]
) -> None:
    monitor = ScheduleMonitor(container, app, "sweep")
    soon = datetime.now(UTC) + timedelta(hours=3)
    monitor.update(ScheduleStatus(NEVER, soon, datetime.now(UTC)))  # a Next the hourly schedule never gives
    calls = Calls()
    start(running, listener(container, app, "a", calls, timer_function(HOURLY)))
    eventually(lambda: (monitor.status() or ScheduleStatus(NEVER, soon, NEVER)).next != soon, 5, "the reset")
    time.sleep(0.5)
    assert calls.runs == []


def test_a_first_start_writes_the_status_and_runs_nothing(
    container: ContainerClient, app: str, running: list[TimerListener]
) -> None:
    calls = Calls()
    start(running, listener(container, app, "a", calls, timer_function(HOURLY)))
    monitor = ScheduleMonitor(container, app, "sweep")
    eventually(lambda: monitor.status() is not None, 5, "the first status")
    status = monitor.status()
    assert status is not None and status.last == NEVER and status.next == Schedule(HOURLY).next_after(
        status.last_updated)
    assert calls.runs == []


def test_schedules_more_often_than_a_minute_run_without_their_status() -> None:
    now = datetime(2026, 12, 5, 12, 0, 30, tzinfo=UTC)
    assert monitor_disabled(Schedule("*/10 * * * * *"), now)
    assert monitor_disabled(Schedule("0,30 * * * * *"), now)
    assert not monitor_disabled(Schedule("0 * * * * *"), now)  # once a minute
    assert not monitor_disabled(Schedule("*/10 */2 * * * *"), now)  # minutes not all *
    assert not monitor_disabled(Schedule(HOURLY), now)


def test_the_host_id_is_the_setting_or_the_machine_and_a_stable_hash_of_the_app_path(tmp_path: Path) -> None:
    assert host_id({"AzureFunctionsWebHost__hostid": "Orders-App"}, tmp_path) == "orders-app"
    assert host_id({"AzureFunctionsWebHost__hostid": "x" * 31 + "-abc"}, tmp_path) == "x" * 31
    machine = re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())
    expected = f"{machine}-{abs(stable_hash(str(tmp_path.resolve())))}".lower()[:32].rstrip("-")
    assert host_id({}, tmp_path) == expected
    # .NET's unchecked int arithmetic: 23, then h * 31 + c.
    assert stable_hash("abc") == ((23 * 31 + 97) * 31 + 98) * 31 + 99
    wrapped = 23
    for char in "/home/site/wwwroot/app":  # overflows, and ends negative: wraps as a 32-bit int does
        wrapped = ctypes.c_int32(wrapped * 31 + ord(char)).value
    assert stable_hash("/home/site/wwwroot/app") == wrapped < 0
    assert stable_hash("") == 23


def test_host_json_singleton_periods_are_read_and_held_to_the_hosts_bounds(tmp_path: Path) -> None:
    def config(section: dict[str, str]) -> HostConfig:
        (tmp_path / "host.json").write_text(json.dumps({"version": "2.0", "singleton": section}))
        return HostConfig.load(tmp_path, None)

    assert config({}).singleton() == SingletonOptions(60, 60)
    assert config({"listenerLockPeriod": "00:00:15", "listenerLockRecoveryPollingInterval": "00:00:20"}).singleton() \
        == SingletonOptions(15, 20)
    with pytest.raises(HostError, match="listenerLockPeriod must be 15 to 60 seconds, not 90"):
        config({"listenerLockPeriod": "00:01:30"}).singleton()
    with pytest.raises(HostError, match="RecoveryPollingInterval must be 15 seconds or more, not 5"):
        config({"listenerLockRecoveryPollingInterval": "00:00:05"}).singleton()


def test_a_failed_invocation_is_logged_with_the_first_line_of_its_error_or_the_worker_gone() -> None:
    exception = protos.RpcException(message="TransientStoreError: query of outbox entries: 503\nTraceback ...")
    failed = protos.InvocationResponse(result=protos.StatusResult(status=protos.StatusResult.Failure,
                                                                  exception=exception))
    assert failure(failed) == "TransientStoreError: query of outbox entries: 503"
    assert failure(None) == "the worker exited"
