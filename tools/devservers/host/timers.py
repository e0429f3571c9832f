"""Timer triggers: six-field NCRONTAB schedules (seconds first) and ``runOnStartup``.

A field is ``*``, a number, a range ``a-b``, a list ``a,b``, or any of these with a step ``/n``;
months and days of the week also take their three-letter English names, and Sunday is 0. Times are
UTC (Azure's default, ``WEBSITE_TIME_ZONE`` unset). The function gets the TimerInfo JSON the host sends.

As on Azure, a timer function is a singleton across the host processes that run the same app (host ID)
against the same ``AzureWebJobsStorage``: the one process that holds the listener's blob lease runs the
schedule, one invocation at a time, and another takes over when that lease expires
(``devservers.host.singleton``). Each start of the listener, at the host's start or on a takeover, fires at
once for an occurrence missed meanwhile (past due, by the schedule status in storage), else for
``runOnStartup``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from azure.core.exceptions import AzureError

from devservers.host.process import Function, failure
from devservers.host.protos import protos
from devservers.host.singleton import (
    NEVER,
    ListenerLease,
    ScheduleMonitor,
    ScheduleStatus,
    host_container,
    host_id,
)

if TYPE_CHECKING:
    from devservers.host.core import HostConfig, SingletonOptions

logger = logging.getLogger("devservers.host")
_NAMES = {name: n for n, name in enumerate(("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT",
                                            "NOV", "DEC"), start=1)}
_NAMES.update({name: n for n, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))})
# (lowest, highest) of second, minute, hour, day of month, month, day of week
_RANGES = ((0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 6))


class Schedule:
    """A parsed NCRONTAB expression; ``next_after`` finds the next second it fires."""

    def __init__(self, expression: str) -> None:
        fields = expression.split()
        if len(fields) != 6:
            raise ValueError(f"NCRONTAB {expression!r} needs six fields (second minute hour day month weekday)")
        self.expression = expression
        self._allowed = [_parse(field, low, high) for field, (low, high) in zip(fields, _RANGES, strict=True)]

    def matches(self, moment: datetime) -> bool:
        """Whether the schedule fires at this second."""
        values = (moment.second, moment.minute, moment.hour, moment.day, moment.month, (moment.weekday() + 1) % 7)
        return all(value in allowed for value, allowed in zip(values, self._allowed, strict=True))

    def next_after(self, moment: datetime) -> datetime:
        """The first second after ``moment`` that the schedule fires at (within five years)."""
        candidate = moment.replace(microsecond=0) + timedelta(seconds=1)
        seconds, minutes, hours, days, months, weekdays = self._allowed
        limit = candidate + timedelta(days=5 * 366)
        while candidate < limit:
            if candidate.month not in months:
                candidate = (candidate.replace(day=1, hour=0, minute=0, second=0) + timedelta(days=32)).replace(day=1)
            elif candidate.day not in days or (candidate.weekday() + 1) % 7 not in weekdays:
                candidate = candidate.replace(hour=0, minute=0, second=0) + timedelta(days=1)
            elif candidate.hour not in hours:
                candidate = candidate.replace(minute=0, second=0) + timedelta(hours=1)
            elif candidate.minute not in minutes:
                candidate = candidate.replace(second=0) + timedelta(minutes=1)
            elif candidate.second not in seconds:
                candidate += timedelta(seconds=1)
            else:
                return candidate
        raise ValueError(f"NCRONTAB {self.expression!r} never fires")


def _parse(field: str, low: int, high: int) -> frozenset[int]:
    allowed: set[int] = set()
    for part in field.upper().split(","):
        span, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if span == "*":
            first, last = low, high
        else:
            start, _, end = span.partition("-")
            first = _value(start)
            last = _value(end) if end else (high if step_text else first)
        if not low <= first <= last <= high or step < 1:
            raise ValueError(f"NCRONTAB field {field!r} is outside {low}-{high}")
        allowed.update(range(first, last + 1, step))
    return frozenset(allowed)


def _value(text: str) -> int:
    return _NAMES[text] if text in _NAMES else int(text)


def monitor_disabled(schedule: Schedule, now: datetime) -> bool:
    """Whether the host runs this schedule without its status (``TimerSchedule.ShouldDisableScheduleMonitor``):
    minutes and everything above them are ``*``, and it fires more than once in the next minute."""
    if any(field != "*" for field in schedule.expression.split()[1:]):
        return False
    first = schedule.next_after(now)
    return schedule.next_after(first) <= now + timedelta(minutes=1)


def timer_info(schedule: Schedule, status: ScheduleStatus | None, past_due: bool) -> Any:
    """The TimerInfo JSON the host passes to a timer function: the status as it was before this invocation
    (null when the schedule runs without one), and whether it is past due."""
    return protos.TypedData(json=json.dumps({"Schedule": {"AdjustForDST": True},
                                             "ScheduleStatus": status.to_json() if status else None,
                                             "IsPastDue": past_due}))


class TimerListener:
    """Runs one timer function on its schedule in the one host process that holds its listener lease."""

    def __init__(self, function: Function, invoke: Callable[[Function, dict[str, Any], dict[str, Any]], Any],
                 lease: ListenerLease, monitor: ScheduleMonitor | None, options: SingletonOptions, *,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.function = function
        self.schedule = Schedule(str(function.trigger["schedule"]))
        self._invoke = invoke
        self._lease = lease
        self._monitor = None if monitor_disabled(self.schedule, clock()) else monitor
        self._options = options
        self._clock = clock
        self._status: ScheduleStatus | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{function.name}-timer", daemon=True)

    @classmethod
    def for_function(cls, function: Function, config: HostConfig,
                     invoke: Callable[[Function, dict[str, Any], dict[str, Any]], Any]) -> TimerListener:
        """The listener of a timerTrigger, its lease and status in the app's ``AzureWebJobsStorage``."""
        container = host_container(config.settings)
        host = host_id(config.settings, config.app_dir)
        options = config.singleton()
        return cls(function, invoke, ListenerLease(container, host, function.name, options.listener_lock_period),
                   ScheduleMonitor(container, host, function.name), options)

    def start(self) -> None:
        """Try for the lease now, and every recovery interval until this process has it."""
        self._thread.start()

    def stop(self) -> None:
        """Stop firing; a running invocation finishes first; the lease is released."""
        self._stopping.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                acquired = self._lease.acquire()
            except AzureError as error:
                logger.error("%s: AzureWebJobsStorage did not answer (%s); trying again in %.0f s",
                             self._lease.name, type(error).__name__,
                             self._options.listener_lock_recovery_polling_interval)
                acquired = False
            if acquired:
                logger.info("%s timer: this host process holds the listener lease", self.function.name)
                self._hold()
                if self._stopping.is_set():
                    return
            if self._stopping.wait(self._options.listener_lock_recovery_polling_interval):
                return

    def _hold(self) -> None:
        """Listen while the lease is renewed; on stop, release it. Losing it stops the listener (the Functions
        host stops itself then, and comes back to try for the lease as at start)."""
        lost = threading.Event()
        renewal = threading.Thread(target=self._renew, args=(lost,), name=f"{self.function.name}-lease", daemon=True)
        renewal.start()
        try:
            self._listen(lost)
        finally:
            lost.set()
            renewal.join()
            if self._stopping.is_set():
                self._lease.release()

    def _renew(self, lost: threading.Event) -> None:
        """Renew every half period; after a failure storage did not answer, again at half the delay (1 s at least)."""
        delay = self._options.listener_lock_period / 2
        while not lost.wait(delay) and not self._stopping.is_set():
            renewed = self._lease.renew()
            if renewed is False:
                logger.error("%s timer: the listener lease is lost; this host process stops running the timer",
                             self.function.name)
                lost.set()
            delay = self._options.listener_lock_period / 2 if renewed else max(1.0, delay / 2)

    def _listen(self, lost: threading.Event) -> None:
        """As the timer listener starts: a past-due occurrence at once, else runOnStartup; then the schedule."""
        now = self._clock()
        past_due = False
        if self._monitor is not None:
            self._status, past_due = self._check_past_due(now)
        if past_due or self.function.trigger.get("runOnStartup"):
            self._fire(None, past_due=past_due)
        while not self._stopping.is_set() and not lost.is_set():
            due = self.schedule.next_after(self._clock())
            wait = max(0.0, (due - self._clock()).total_seconds())
            if self._stopping.wait(wait) or lost.is_set():
                return
            self._fire(due, past_due=(self._clock() - due).total_seconds() > 1)

    def _check_past_due(self, now: datetime) -> tuple[ScheduleStatus, bool]:
        """``ScheduleMonitor.CheckPastDueAsync``: the stored status (written first when there is none, or when the
        schedule changed), and whether its next occurrence has passed."""
        assert self._monitor is not None
        status = self._monitor.status()
        if status is None:
            status = ScheduleStatus(NEVER, self.schedule.next_after(now), now)
            self._monitor.update(status)
            return status, False
        since = status.last if status.last > NEVER else status.last_updated if status.last_updated > NEVER else now
        expected = self.schedule.next_after(since)
        if status.next != expected:  # the schedule changed since the status was written
            last_updated = status.last_updated
            if now > expected:
                expected, last_updated = self.schedule.next_after(now), now
            status = ScheduleStatus(NEVER, expected, last_updated)
            self._monitor.update(status)
        return status, now > status.next

    def _fire(self, due: datetime | None, *, past_due: bool) -> None:
        """Invoke for the occurrence ``due`` (None: at the listener's start), then record it in the status."""
        started = time.perf_counter()
        response = self._invoke(self.function, {self.function.parameter: timer_info(
            self.schedule, self._status, past_due)}, {})
        succeeded = response is not None and response.result.status == protos.StatusResult.Success
        logger.info("%s timer outcome=%s %.0f ms due=%s%s", self.function.name, "Succeeded" if succeeded else "Failed",
                    (time.perf_counter() - started) * 1000, due.isoformat() if due else "startup",
                    "" if succeeded else f" error={failure(response)}")
        if self._monitor is not None:
            ran = self._clock()
            if due is not None and self._status is not None and not past_due and ran < self._status.next:
                ran = self._status.next  # fired a moment early: it stands for the occurrence it was due for
            self._status = ScheduleStatus(ran, self.schedule.next_after(ran), ran)
            self._monitor.update(self._status)
