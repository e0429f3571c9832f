"""The host's settlement rules, seen through an app that breaks them on purpose (tests/host/rules_app)."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devservers.servicebus import Broker
from tests.host.conftest import NEEDS_313, RULES_APP, HostProcess, eventually, peek, send

pytestmark = NEEDS_313


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    return tmp_path / "journal.jsonl"


@pytest.fixture
def rules_host(broker: Broker, journal: Path, start_host: Callable[..., HostProcess]) -> Iterator[HostProcess]:
    values = {"FUNCTIONS_WORKER_RUNTIME": "python", "ServiceBusConnection": broker.connection_string,
              "RULES_JOURNAL": str(journal)}
    yield start_host(RULES_APP, values)


def entries(journal: Path, message_id: str) -> list[dict[str, Any]]:
    if not journal.exists():
        return []
    lines = [json.loads(line) for line in journal.read_text().splitlines() if line]
    return [e for e in lines if e["messageId"] == message_id]


def test_a_function_that_raises_has_its_message_abandoned_and_redelivered(
    broker: Broker, rules_host: HostProcess, journal: Path
) -> None:
    message_id = f"m-{uuid.uuid4()}"
    send(broker, "raises", b"{}", message_id=message_id)
    # MaxDeliveryCount 3: three calls, each abandoned by the host, then the broker dead-letters it.
    eventually(lambda: [m for m in peek(broker, "raises", dead_letters=True) if m.message_id == message_id],
               what="the message dead-lettered after its deliveries")
    assert [e["event"] for e in entries(journal, message_id)] == ["called"] * 3
    assert "raises" in rules_host.output() and "settlement=abandon (host)" in rules_host.output()


def test_a_settlement_after_the_function_returned_fails(
    broker: Broker, rules_host: HostProcess, journal: Path
) -> None:
    message_id = f"m-{uuid.uuid4()}"
    send(broker, "settles-late", b"{}", message_id=message_id)
    refused = eventually(lambda: [e for e in entries(journal, message_id) if "late complete" in e["event"]],
                         what="the late settlement's answer")
    assert refused[0]["event"].startswith("late complete refused")
    assert "not found" in refused[0]["event"]


def test_an_unsettled_message_comes_back_after_its_lock_and_the_host_warns(
    broker: Broker, rules_host: HostProcess, journal: Path
) -> None:
    message_id = f"m-{uuid.uuid4()}"
    send(broker, "unsettled", b"{}", message_id=message_id)
    eventually(lambda: [e for e in entries(journal, message_id) if e["event"] == "completed"],
               what="the redelivery after the lock expired")
    assert [e["event"] for e in entries(journal, message_id)] == ["left unsettled", "completed"]
    assert f"unsettled returned without settling messageId={message_id}" in rules_host.output()
    assert not [m for m in peek(broker, "unsettled") if m.message_id == message_id]


def test_sigterm_lets_the_invocation_in_flight_finish_then_exits_0(
    broker: Broker, rules_host: HostProcess, journal: Path
) -> None:
    message_id = f"m-{uuid.uuid4()}"
    send(broker, "slow", b"{}", message_id=message_id)
    eventually(lambda: entries(journal, message_id), what="the slow function starting")
    assert rules_host.terminate() == 0
    assert [e["event"] for e in entries(journal, message_id)] == ["started", "completed"]
    assert not [m for m in peek(broker, "slow") if m.message_id == message_id]


def test_a_sigterm_the_kernel_hands_to_another_of_the_hosts_threads_still_stops_it(rules_host: HostProcess) -> None:
    # The kernel gives a process's SIGTERM to whichever of its threads takes it first; here it is given to one
    # receiving slot, on purpose. A main thread asleep in Event.wait() never woke for it (the host then waited out
    # the test's stop timeout), because Python runs the handler only on the main thread, once that is awake.
    pid = rules_host.process.pid
    other = next(int(tid) for tid in sorted(os.listdir(f"/proc/{pid}/task")) if int(tid) != pid)
    assert ctypes.CDLL(None, use_errno=True).tgkill(pid, other, signal.SIGTERM) == 0
    assert rules_host.process.wait(20) == 0
    assert "stopping: no new messages" in rules_host.output()


def test_function_timeout_restarts_the_worker_and_the_message_in_flight_is_abandoned(
    broker: Broker, rules_host: HostProcess, journal: Path
) -> None:
    message_id = f"m-{uuid.uuid4()}"
    send(broker, "hangs", b"{}", message_id=message_id)
    eventually(lambda: [e for e in entries(journal, message_id) if e["event"] == "completed"], timeout=45,
               what="the redelivery on the restarted worker")
    assert [e["event"] for e in entries(journal, message_id)] == ["hanging", "completed"]
    assert "exceeded functionTimeout" in rules_host.output()


def test_a_killed_worker_is_restarted_and_the_message_in_flight_comes_back_to_it(
    broker: Broker, rules_host: HostProcess, journal: Path
) -> None:
    message_id = f"m-{uuid.uuid4()}"
    send(broker, "slow", b"{}", message_id=message_id)
    eventually(lambda: entries(journal, message_id), what="the slow function starting")
    pid = rules_host.process.pid
    (worker,) = (int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
    os.kill(worker, signal.SIGKILL)  # the chaos suite's kill of a worker alone
    eventually(lambda: [e for e in entries(journal, message_id) if e["event"] == "completed"], timeout=45,
               what="the redelivery on the restarted worker")
    assert [e["event"] for e in entries(journal, message_id)] == ["started", "started", "completed"]
    assert "worker exited: restarting it" in rules_host.output()
    assert not [m for m in peek(broker, "slow", dead_letters=True) if m.message_id == message_id]
