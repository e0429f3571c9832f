"""Hundreds of seeded runs of the real handlers break no invariant, and a seed replays its run step for step."""

from __future__ import annotations

from collections import Counter
from functools import cache

import pytest

from simulation.report import RunReport
from simulation.run import simulate as simulate_seed

SMOKE_SEEDS = 160  # storms make a seed heavier: a quarter of them hold hundreds of events for one order
# A seed's run is the same run each time (test_a_seed_replays_its_run_step_for_step), so the tests below read one run
# of each seed, made once: they go to one pytest worker together under make test's --dist loadgroup.
pytestmark = pytest.mark.xdist_group("simulation-smoke")


@cache
def simulate(seed: int) -> RunReport:
    """The run of ``seed`` without a trace, made once for this module's tests (which only read it)."""
    return simulate_seed(seed)


# CPU-bound: about 50 s on an idle 2-core machine, over the 120 s default on a busy one beside the stack runs.
@pytest.mark.timeout(300)
def test_no_seed_breaks_an_invariant() -> None:
    failing = {seed: [str(v) for v in report.violations]
               for seed in range(SMOKE_SEEDS) if (report := simulate(seed)).violations}
    assert failing == {}, "replay one with: python -m simulation --seed SEED --trace"


def test_the_smoke_runs_exercise_every_kind_of_fault_and_outcome_that_matters() -> None:
    reports = [simulate(seed) for seed in range(50)]
    faults = {kind for report in reports for kind in report.faults}
    outcomes = {outcome for report in reports for outcome in report.outcomes}
    assert faults == {"crash", "fail_before", "fail_after", "slow", "clock", "release_session"}
    assert {"created", "duplicate", "applied", "parked", "payload_mismatch", "invalid", "transient"} <= outcomes
    assert sum(report.settlements["lock_lost"] for report in reports) > 0


def test_the_foreign_writers_write_on_every_kind_of_document_and_the_app_meets_their_412s() -> None:
    reports = [simulate(seed) for seed in range(50)]
    written = {kind for report in reports for kind in report.foreign_writes}
    races = sum((report.foreign_races for report in reports), Counter())
    assert written == {"order", "order-pending", "outbox", "side-effect", "inbox", "event-identity", "parked-event"}
    assert races["app_412"] > 0 and races["writer_412"] > 0 and races["gone"] > 0


def test_the_smoke_runs_reach_the_limits_storms_full_batches_and_pages_past_the_first() -> None:
    reports = [simulate(seed) for seed in range(40)]
    assert sum(report.storm for report in reports) >= 5
    assert max(report.limits["largest_batch"] for report in reports) == 100  # filled to Cosmos DB's limit, not past
    assert sum(report.limits["queries_past_a_page"] > 0 for report in reports) > len(reports) / 2
    assert "invalid_transition" in {o for report in reports for o in report.outcomes}  # storm events after the end


def test_a_seed_replays_its_run_step_for_step() -> None:
    first, again = simulate_seed(7, trace=True), simulate_seed(7, trace=True)
    assert first.trace and first.trace == again.trace
    assert (first.steps, first.outcomes, first.faults) == (again.steps, again.outcomes, again.faults)


def test_another_seed_makes_another_run() -> None:
    assert simulate_seed(7, trace=True).trace != simulate_seed(8, trace=True).trace


def test_some_seeds_run_the_events_queue_without_sessions_and_then_one_orders_events_run_at_once() -> None:
    reports = [simulate(seed) for seed in range(50)]
    modes = Counter(report.events_queue for report in reports)
    assert modes["plain"] > 0 and modes["sessions"] > 0, modes
    assert sum(report.concurrent_events for report in reports if report.events_queue == "plain") > 0


def test_long_outages_reach_the_backoff_ceiling_the_last_delivery_and_the_limit_and_the_operator_resubmits() -> None:
    reports = [report for seed in range(80) if (report := simulate(seed)).outage is not None and report.outage.long]
    assert reports, "no seed below 80 had an outage longer than RETRY_TOTAL_SECONDS"
    limited = sum(report.outcomes["retry_limit_exceeded"] for report in reports)
    assert sum(report.at_ceiling for report in reports) > 0  # copies 15 minutes apart
    assert limited > 0 and sum(report.resubmitted for report in reports) == limited
    assert all(not report.violations for report in reports)  # each tried at its last delivery (`settlement`)


def test_orders_cancelled_while_their_reservation_waits_end_order_closed() -> None:
    assert sum(simulate(seed).outcomes["order_closed"] for seed in range(40)) > 0
