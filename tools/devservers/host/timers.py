"""Timer triggers: six-field NCRONTAB schedules (seconds first) and ``runOnStartup``.

A field is ``*``, a number, a range ``a-b``, a list ``a,b``, or any of these with a step ``/n``;
months and days of the week also take their three-letter English names, and Sunday is 0. Times are
UTC (Azure's default, ``WEBSITE_TIME_ZONE`` unset). The function gets the TimerInfo JSON the host sends.

As on Azure, a timer function is a singleton across the host processes that run the same app against
the same store: each occurrence fires in one of them, and none while an invocation still runs
(``devservers.host.singleton``). ``runOnStartup`` fires in each process as it starts, unless another is
running the function at that moment.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from devservers.host.process import Function
from devservers.host.protos import protos
from devservers.host.singleton import OccurrenceLock, store_scope

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


def timer_info(schedule: Schedule, last: datetime | None, now: datetime, past_due: bool) -> Any:
    """The TimerInfo JSON the host passes to a timer function."""
    status = {"Last": (last or now).isoformat(), "Next": schedule.next_after(now).isoformat(),
              "LastUpdated": now.isoformat()}
    return protos.TypedData(json=json.dumps({"Schedule": {"AdjustForDST": True}, "ScheduleStatus": status,
                                             "IsPastDue": past_due}))


class TimerListener:
    """Fires one timer function on its schedule, never twice at once, each occurrence in one process only."""

    def __init__(self, function: Function, invoke: Callable[[Function, dict[str, Any], dict[str, Any]], Any],
                 lock: OccurrenceLock, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.function = function
        self.schedule = Schedule(str(function.trigger["schedule"]))
        self._invoke = invoke
        self._lock = lock
        self._clock = clock
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{function.name}-timer", daemon=True)

    @classmethod
    def for_function(cls, function: Function, settings: dict[str, str], functions: list[Function],
                     invoke: Callable[[Function, dict[str, Any], dict[str, Any]], Any]) -> TimerListener:
        """The listener of a timerTrigger, its lock scoped by what the app's host processes share."""
        return cls(function, invoke, OccurrenceLock(function.name, store_scope(settings, functions)))

    def start(self) -> None:
        """Start firing; at once too when ``runOnStartup`` is set."""
        self._thread.start()

    def stop(self) -> None:
        """Stop firing; a running invocation finishes first."""
        self._stopping.set()
        self._thread.join()

    def _run(self) -> None:
        last: datetime | None = None
        if self.function.trigger.get("runOnStartup"):
            last = self._fire(last, None) or last
        while not self._stopping.is_set():
            due = self.schedule.next_after(self._clock())
            if self._stopping.wait(max(0.0, (due - self._clock()).total_seconds())):
                return
            last = self._fire(last, due) or last

    def _fire(self, last: datetime | None, due: datetime | None) -> datetime | None:
        """Invoke for the occurrence ``due`` (None: on startup) unless another process has it; when it ran."""
        now = self._clock()
        with self._lock.claim(due, now) as mine:
            if not mine:
                logger.debug("%s timer due=%s: another host process has it", self.function.name,
                             due.isoformat() if due else "startup")
                return None
            started = time.perf_counter()
            response = self._invoke(self.function, {self.function.parameter: timer_info(
                self.schedule, last, now, past_due=due is not None and (now - due).total_seconds() > 1)}, {})
            succeeded = response is not None and response.result.status == protos.StatusResult.Success
            logger.info("%s timer outcome=%s %.0f ms due=%s", self.function.name,
                        "Succeeded" if succeeded else "Failed", (time.perf_counter() - started) * 1000,
                        due.isoformat() if due else "startup")
        return now
