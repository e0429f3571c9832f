"""One seeded run: build the world, start the actors, run until drained, check the invariants."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from simulation import actors
from simulation.invariants import check, delivered
from simulation.report import RunReport
from simulation.world import Wiring, World

# Long enough for a run whose faults stopped to drain: redeliveries, lock expiries, a few sweeps.
MAX_SIMULATED_SECONDS = 6 * 3600.0


def simulate(seed: int, *, wiring: Wiring | None = None, trace: bool = False,
             observe: Callable[[World], object] | None = None) -> RunReport:
    """Run one seed; the same seed (and wiring) gives the same run, step for step. ``observe`` is handed the
    world once the run has ended (tests read its store)."""
    with _quiet_logs():
        world = World(seed, wiring or Wiring(), trace=trace)
        actors.start(world)
        try:
            drained = world.sched.run(world.drained, deadline=world.clock.now + MAX_SIMULATED_SECONDS)
        finally:
            world.sched.close()
        violations = check(world, drained)
        if observe is not None:
            observe(world)
        resent = sum(len(ids) - 1 for destination in (world.settings.outbox_destination,
                                                      world.settings.outbox_rejected_destination)
                     for ids in delivered(world, destination).values())
        races = world.foreign_stats + Counter(app_412=world.history.app_conflicts)
    return RunReport(seed, world.chaos.steps, world.deliveries, world.clock.elapsed(), world.chaos.injected,
                     world.outcomes, world.settlements, violations, resent, world.sched.trace_lines,
                     world.foreign_writes, races, "sessions" if world.events_sessions else "plain",
                     world.concurrent_events, world.storm, world.store_proxy.limits, world.chaos.outage,
                     world.breakers_opened, world.namespace.at_ceiling, world.resubmitted)


@contextmanager
def _quiet_logs() -> Iterator[None]:
    """The handlers log every warning they meet, thousands per run; the trace tells the run instead."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)
