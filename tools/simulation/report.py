"""What runs report: one run's counts, violations and trace, and the totals over many seeds."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from simulation.faults import Outage
from simulation.invariants import Violation


@dataclass(frozen=True)
class RunReport:
    """One seed's run."""

    seed: int
    steps: int
    deliveries: int
    sim_seconds: float
    faults: Counter[str]
    outcomes: Counter[str]
    settlements: Counter[str]
    violations: list[Violation]
    resent_past_window: int = 0  # outcome copies a destination kept twice, the second past its window
    trace: list[str] | None = None
    foreign_writes: Counter[str] = field(default_factory=Counter)  # kind -> the other writers' writes
    # writer_412 (a foreign replace lost to a change), gave_up, gone (removed first), app_412 (the app's
    # etag-conditional write refused on a document a foreign writer wrote last)
    foreign_races: Counter[str] = field(default_factory=Counter)
    events_queue: str = "sessions"  # how the seed's events queue delivered: "sessions", or "plain" (no sessions)
    concurrent_events: int = 0  # event deliveries that began while another of the same order's was running
    storm: bool = False  # one order was a storm (simulation.workload)
    limits: Counter[str] = field(default_factory=Counter)  # proxies.FaultyStore.limits
    outage: Outage | None = None
    breaker_opened: int = 0  # how often a queue's breaker opened
    at_ceiling: int = 0  # copies scheduled the back-off's ceiling (15 minutes) after their hand-on
    resubmitted: int = 0  # RetryLimitExceeded dead letters the operator resubmitted after a long outage

    def replay(self) -> str:
        """The one-line command that replays this run with its trace."""
        return f"python -m simulation --seed {self.seed} --trace"

    def summary(self) -> str:
        """One line of counts."""
        return (f"seed {self.seed}: {self.steps} steps, {self.deliveries} deliveries, {self.sim_seconds:.0f} s"
                f" simulated; faults {_counts(self.faults)}; outcomes {_counts(self.outcomes)};"
                f" settlements {_counts(self.settlements)}; foreign writes {_counts(self.foreign_writes)}"
                f" ({_counts(self.foreign_races) or 'no races'}); outcomes resent past the window"
                f" {self.resent_past_window}; events queue {self.events_queue}, {self.concurrent_events} event"
                f" deliveries beside another of their order's; {_outage(self.outage, self.breaker_opened)};"
                f" {len(self.violations)} violations")


@dataclass
class Totals:
    """Sums over many runs."""

    seeds: int = 0
    steps: int = 0
    deliveries: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    settlements: Counter[str] = field(default_factory=Counter)
    violations: Counter[str] = field(default_factory=Counter)
    foreign_writes: Counter[str] = field(default_factory=Counter)
    foreign_races: Counter[str] = field(default_factory=Counter)
    resent_past_window: list[int] = field(default_factory=list)  # seeds where it happened
    failing: list[int] = field(default_factory=list)
    events_queues: Counter[str] = field(default_factory=Counter)  # seeds by events-queue mode
    concurrent_events: int = 0
    storms: int = 0
    past_a_page: int = 0  # seeds where a query was read past its first page
    full_batches: int = 0  # batches of 90 operations or more
    largest_batch: int = 0
    outages: Counter[str] = field(default_factory=Counter)  # seeds by the dependency that went down
    outage_seconds: float = 0.0
    longest_outage: float = 0.0
    refused_in_outages: int = 0
    breaker_opened: int = 0
    long_outages: int = 0  # seeds whose outage outlasted RETRY_TOTAL_SECONDS
    at_ceiling: int = 0
    resubmitted: int = 0

    def add(self, report: RunReport) -> None:
        """Count one run in."""
        self.seeds += 1
        self.steps += report.steps
        self.deliveries += report.deliveries
        self.faults.update(report.faults)
        self.outcomes.update(report.outcomes)
        self.settlements.update(report.settlements)
        self.violations.update(v.rule for v in report.violations)
        self.foreign_writes.update(report.foreign_writes)
        self.foreign_races.update(report.foreign_races)
        self.events_queues[report.events_queue] += 1
        self.concurrent_events += report.concurrent_events
        self.storms += report.storm
        self.past_a_page += report.limits["queries_past_a_page"] > 0
        self.full_batches += report.limits["batches_of_90_or_more"]
        self.largest_batch = max(self.largest_batch, report.limits["largest_batch"])
        if report.outage is not None:
            length = report.outage.end - report.outage.start
            self.outages[report.outage.dependency] += 1
            self.outage_seconds += length
            self.longest_outage = max(self.longest_outage, length)
            self.refused_in_outages += report.outage.refused
            self.long_outages += report.outage.long
        self.breaker_opened += report.breaker_opened
        self.at_ceiling += report.at_ceiling
        self.resubmitted += report.resubmitted
        if report.resent_past_window:
            self.resent_past_window.append(report.seed)
        if report.violations:
            self.failing.append(report.seed)

    def lines(self, elapsed: float) -> list[str]:
        """The totals as printed at the end of a batch of seeds."""
        per_minute = self.seeds / elapsed * 60 if elapsed > 0 else float("inf")
        return [
            f"seeds        {self.seeds} ({len(self.failing)} failing)",
            f"steps        {self.steps}",
            f"deliveries   {self.deliveries}",
            f"faults       {sum(self.faults.values())}: {_counts(self.faults)}",
            f"outcomes     {_counts(self.outcomes)}",
            f"settlements  {_counts(self.settlements)}",
            f"foreign      {sum(self.foreign_writes.values())} writes: {_counts(self.foreign_writes)}; the app's"
            f" 412s on them {self.foreign_races['app_412']}, their own 412s {self.foreign_races['writer_412']}"
            f" (given up {self.foreign_races['gave_up']}), documents gone first {self.foreign_races['gone']}",
            f"events queue {_counts(self.events_queues)} seeds; {self.concurrent_events} event deliveries began beside"
            f" another of their order's",
            f"limits       storms in {self.storms} seeds; a query read past its first page in {self.past_a_page}"
            f" ({self.past_a_page / max(self.seeds, 1):.0%}); {self.full_batches} batches of 90 to 100 operations,"
            f" the largest {self.largest_batch}",
            f"outages      {sum(self.outages.values())} seeds: {_counts(self.outages) or 'none'};"
            f" {self.outage_seconds:.0f} s down in all, the longest {self.longest_outage:.0f} s;"
            f" {self.refused_in_outages} calls refused meanwhile;"
            f" breakers opened {self.breaker_opened} times; handed on {self.outcomes['handed_on']}",
            f"long         {self.long_outages} seeds past RETRY_TOTAL_SECONDS: {self.at_ceiling} copies due the"
            f" back-off's ceiling after their hand-on; RetryLimitExceeded"
            f" {self.outcomes['retry_limit_exceeded']}, each tried at its last delivery, {self.resubmitted}"
            " resubmitted by the operator",
            f"violations   {sum(self.violations.values())}: {_counts(self.violations) or 'none'}",
            f"OrderAccepted or OrderRejected resent past the destination's detection window in"
            f" {len(self.resent_past_window)} seeds"
            f" (the design's limit, not a violation){': ' if self.resent_past_window else ''}"
            f"{' '.join(map(str, self.resent_past_window[:10]))}",
            f"elapsed      {elapsed:.1f} s, {per_minute:.0f} seeds/minute",
        ]


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(counter.items()))


def _outage(outage: Outage | None, opened: int) -> str:
    if outage is None:
        return "no outage"
    return (f"{outage.dependency} down {outage.end - outage.start:.0f} s, {outage.refused} calls refused meanwhile,"
            f" breakers opened {opened} times")
