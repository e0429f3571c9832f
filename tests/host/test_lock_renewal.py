"""The local host renews locks as the Functions host does: a message's lock from just before its function runs
until it returns, a session's from its acceptance, each for at most maxAutoLockRenewalDuration counted once
from that start, renewed when min(half the time left, 10 s) is left; an app setting overrides host.json."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import MessageLockLostError, ServiceBusConnectionError

from devservers.host.core import HostConfig, _overridden, timespan_seconds
from devservers.host.locks import LockRenewal, renew_delay
from devservers.servicebus import Broker
from tests.host.conftest import NEEDS_313, RULES_APP, SETTLEMENT_APP, HostProcess, eventually, peek, send

SETTING = "AzureFunctionsJobHost__extensions__serviceBus__maxAutoLockRenewalDuration"
LOCK_SECONDS = 5.0  # the renews and renews-sessions queues' LockDuration (tests/host/conftest.py)


class Lock:
    """A lock that lasts ``seconds`` from each renewal, and records when it was renewed."""

    def __init__(self, seconds: float, failures: list[Exception] | None = None) -> None:
        self.seconds, self.failures, self.settled = seconds, list(failures or []), False
        self.until = datetime.now(UTC) + timedelta(seconds=seconds)
        self.renewed_at: list[float] = []
        self.renewed = threading.Event()

    def renew(self) -> None:
        if self.failures:
            raise self.failures.pop(0)
        self.until = datetime.now(UTC) + timedelta(seconds=self.seconds)
        self.renewed_at.append(time.monotonic())
        self.renewed.set()

    def locked_until(self) -> datetime | None:
        return None if self.settled else self.until


def renewal(lock: Lock, duration: float) -> LockRenewal:
    return LockRenewal("a test lock", lock.renew, lock.locked_until, duration)


def test_a_lock_is_renewed_when_half_its_time_is_left_and_never_later_than_10_seconds_before_it_ends() -> None:
    assert renew_delay(5.0) == 2.5  # Service Bus's shortest lock: renewed 2.5 s before it ends
    assert renew_delay(16.0) == 8.0
    assert renew_delay(60.0) == 50.0  # the default lock: 10 s before it ends
    assert renew_delay(0.3) == 0.0  # under 400 ms: at once


def test_renewal_stops_at_the_max_duration_after_its_start_with_the_lock_held_until_then() -> None:
    lock = Lock(0.8)
    started, started_utc = time.monotonic(), datetime.now(UTC)
    renewal(lock, 1.0).start().join(5)
    # Renewed at 0.4 s and 0.8 s (when half the lock is left), not after 1.0 s ...
    renewed = [at - started for at in lock.renewed_at]
    assert len(renewed) == 2 and abs(renewed[0] - 0.4) < 0.15 and abs(renewed[1] - 0.8) < 0.15, renewed
    # ... and the last renewal holds the lock past 1.0 s.
    assert lock.until >= started_utc + timedelta(seconds=1.0)


def test_a_max_duration_of_0_renews_nothing() -> None:
    lock = Lock(0.2)
    renewal(lock, 0).start().join(1)
    time.sleep(0.3)
    assert lock.renewed_at == []


def test_renewal_ends_when_stopped_or_when_the_message_is_settled() -> None:
    stopped, settled = Lock(0.6), Lock(0.6)
    first, second = renewal(stopped, 60).start(), renewal(settled, 60).start()
    assert stopped.renewed.wait(2) and settled.renewed.wait(2)
    first.stop()
    settled.settled = True
    first.join(2)
    second.join(2)
    assert len(stopped.renewed_at) == 1 and len(settled.renewed_at) == 1


def test_a_lost_lock_ends_renewal_with_a_warning_and_a_transient_failure_is_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lost, flaky = Lock(0.2, [MessageLockLostError(message="lock lost")]), Lock(0.2, [ServiceBusConnectionError()])
    with caplog.at_level(logging.WARNING, logger="devservers.host"):
        renewal(lost, 60).start().join(2)
        retried = renewal(flaky, 60).start()
        assert flaky.renewed.wait(3)
        retried.stop()
    assert lost.renewed_at == []
    assert "renewing the lock of a test lock failed (MessageLockLostError: lock lost); renewal stops" in caplog.text
    assert "failed (ServiceBusConnectionError" in caplog.text and "trying again" in caplog.text


def test_an_app_setting_overrides_host_json_whatever_its_case_and_in_any_timespan_form() -> None:
    host_json = {"extensions": {"serviceBus": {"maxAutoLockRenewalDuration": "00:05:00"}}}

    def renewal_seconds(name: str, value: str) -> float:
        config = HostConfig(Path(), {}, _overridden(json.loads(json.dumps(host_json)), {name: value}))
        return config.service_bus().max_auto_lock_renewal_seconds

    assert renewal_seconds(SETTING, "00:00:08") == 8.0
    assert renewal_seconds(SETTING.upper(), "00:00:08") == 8.0
    assert renewal_seconds("AzureFunctionsJobHost__Extensions__ServiceBus__MaxAutoLockRenewalDuration", "0") == 0.0
    assert (timespan_seconds("00:10"), timespan_seconds("1"), timespan_seconds("00:00:00.5")) == (600.0, 86400.0, 0.5)
    unset = HostConfig(Path(), {}, {"extensions": {"serviceBus": {"autoCompleteMessages": "false"}}}).service_bus()
    assert unset.max_auto_lock_renewal_seconds == 300.0 and unset.auto_complete_messages is False


@pytest.fixture
def renewing_host(broker: Broker, tmp_path: Path, start_host: Callable[..., HostProcess]) -> Callable[..., Path]:
    """Start an app (the settlement app unless told) with maxAutoLockRenewalDuration set by app setting, over its
    host.json's 0; the journal."""
    def start(max_renewal: str, app: Path = SETTLEMENT_APP) -> Path:
        journal = tmp_path / "journal.jsonl"
        start_host(app, {"FUNCTIONS_WORKER_RUNTIME": "python", "ServiceBusConnection": broker.connection_string,
                         "RULES_JOURNAL": str(journal), SETTING: max_renewal})
        return journal
    return start


def events(journal: Path, message_id: str) -> list[str]:
    lines = [json.loads(line) for line in journal.read_text().splitlines()] if journal.exists() else []
    return [line["event"] for line in lines if line["messageId"] == message_id]


@NEEDS_313
def test_a_function_that_sleeps_past_its_lock_within_the_max_renewal_settles_and_is_not_redelivered(
    broker: Broker, renewing_host: Callable[..., Path]
) -> None:
    journal = renewing_host("00:00:08")  # longer than the 6 s sleep, itself longer than the 5 s lock
    message_id = f"m-{uuid.uuid4()}"
    send(broker, "renews", json.dumps({"sleep": LOCK_SECONDS + 1}), message_id=message_id)
    eventually(lambda: len(events(journal, message_id)) > 1, timeout=20, what="the completion after the sleep")
    assert events(journal, message_id) == ["started", "completed"]
    assert not [m for m in peek(broker, "renews") if m.message_id == message_id]


@NEEDS_313
def test_past_the_max_renewal_the_lock_is_lost_the_message_redelivered_and_the_late_settlement_fails(
    broker: Broker, renewing_host: Callable[..., Path]
) -> None:
    journal = renewing_host("00:00:01")  # over before the first renewal, due 2.5 s in
    message_id = f"m-{uuid.uuid4()}"
    send(broker, "renews", json.dumps({"sleep": LOCK_SECONDS + 1}), message_id=message_id)
    eventually(lambda: len(events(journal, message_id)) > 2, timeout=20, what="the redelivery and the late complete")
    # The lock ends 5 s in and the message comes back to another slot; the first call's complete at 6 s fails.
    assert events(journal, message_id) == ["started", "redelivery completed", "complete refused: SettlementError"]


@NEEDS_313
def test_a_message_left_unsettled_is_renewed_no_more_once_its_function_returns(
    broker: Broker, renewing_host: Callable[..., Path]
) -> None:
    journal = renewing_host("00:01:00", RULES_APP)
    message_id = f"m-{uuid.uuid4()}"
    sent = time.monotonic()
    send(broker, "unsettled", b"{}", message_id=message_id)  # a 2 s lock; the function returns without settling
    eventually(lambda: "completed" in events(journal, message_id), timeout=20, what="the redelivery")
    # Back after its 2 s lock, not after the minute of maxAutoLockRenewalDuration.
    assert time.monotonic() - sent < 10
    assert events(journal, message_id) == ["left unsettled", "completed"]


@NEEDS_313
def test_a_session_lock_is_renewed_from_the_sessions_acceptance_for_the_max_renewal_counted_once(
    broker: Broker, renewing_host: Callable[..., Path]
) -> None:
    journal = renewing_host("00:00:04")
    session, first, second = f"s-{uuid.uuid4()}", f"m-1-{uuid.uuid4()}", f"m-2-{uuid.uuid4()}"
    with ServiceBusClient.from_connection_string(broker.connection_string) as client, \
            client.get_queue_sender("renews-sessions") as sender:
        sender.send_messages([ServiceBusMessage(json.dumps({"sleep": 5.5}), message_id=first, session_id=session),
                              ServiceBusMessage(json.dumps({"sleep": 3}), message_id=second, session_id=session)])
    eventually(lambda: "redelivery completed" in events(journal, second) and len(events(journal, second)) > 2,
               timeout=30, what="the second message's late complete and its redelivery")
    # Accepted at 0 with a 5 s lock: renewed at 2.5 s to 7.5 s, and not again after 4 s. The first message
    # completes at 5.5 s under that renewal; the second, from 5.5 s to 8.5 s, outlives the session lock: its
    # renewal was not started again for it.
    assert events(journal, first) == ["started", "completed"]
    assert events(journal, second)[0] == "started"
    assert sorted(events(journal, second)[1:]) == ["complete refused: SettlementError", "redelivery completed"]
