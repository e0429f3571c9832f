"""The simulation kit pointed at an ordered queue (``Consumer.ordered``): the parcel machine of
tests/unit/test_ordered_consumer.py holds the ordered mode's invariants under every fault, and the kit finds a
release that leaves its events parked, and a user's invariant finds what the generic ones cannot know."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections.abc import Sequence

import pytest

from idempotent_consumer.functions import Consumer
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ordered import Ordered
from idempotent_consumer.ordered.machine import Step
from idempotent_consumer.ordered.writes import Parts, Releases
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.ports.store import DocumentStore, Patch
from idempotent_consumer.testing.simulation import Spec, World, simulate
from tests.unit.test_ordered_consumer import FIELD, Parcels

PATHS = (("Accepted", "Dispatched", "Delivered"), ("Accepted", "Lost"), ("Accepted", "Dispatched", "Lost"))


def tracking(rng: random.Random) -> Sequence[bytes]:
    """A few parcels' events, each parcel's along one path of its machine (now and then one past its end, and a
    second scan under its own id at a version another took: stale once that one is applied)."""
    bodies = []
    for n in range(rng.randint(2, 5)):
        parcel, path = f"p-{n}", rng.choice(PATHS)
        types = [*path, "Delivered"] if rng.random() < 0.2 else list(path)
        for sequence, type_ in enumerate(types, 1):
            ids = [f"{parcel}-{sequence}"] + ([f"{parcel}-{sequence}b"] if sequence > 1 and rng.random() < 0.1 else [])
            bodies += [json.dumps({"id": event_id, "source": "carrier", "type": type_, "subject": parcel,
                                   "sequence": sequence, "time": f"2026-12-06T10:0{sequence}:00Z",
                                   "where": rng.choice(["depot", "hub", "van"])}).encode() for event_id in ids]
    return bodies


def altered(body: bytes, rng: random.Random) -> bytes:
    event = json.loads(body)
    return json.dumps({**event, "where": f"{event['where']}-{rng.randint(1, 9)}"}).encode()


def spec(releases: type[Releases] = Releases, *, machine: Parcels | None = None,
         mode_type: type[Ordered] = Ordered) -> Spec:
    parcels = Consumer("parcel-tracker", container="parcels", partition_key=f"/{FIELD}", env={})
    mode = parcels.ordered("tracking", machine or Parcels(), sessions=False)
    name = "parcel_tracker_tracking"
    fields = {f.name: getattr(mode, f.name) for f in dataclasses.fields(mode)}
    parcels.ordered_queues[name] = "tracking", mode_type(**{**fields, "releases": releases})
    return Spec(consumer=parcels, function=name, messages=tracking, alter=altered,
                message_id=lambda body: json.loads(body)["id"])


def test_an_ordered_consumer_holds_the_ordered_invariants_under_every_fault() -> None:
    report = simulate(spec(), range(40))
    assert not report.violations, report.summary()
    # The runs reach what the invariants are about: events before their turn, released; copies; other content.
    for outcome in ("parked", "applied", "duplicate", "stale", "payload_mismatch", "invalid_transition"):
        assert report.outcomes[outcome] > 0, (outcome, report.outcomes)


class KeepsReleasedCopies(Releases):
    """A planted bug: a release applies a parked event, and forgets to remove its parked copy."""

    def step_parts(self, step: Step) -> Parts:
        return [part for part in super().step_parts(step) if step.event is None or part[0] != "released"]


def test_it_finds_a_release_that_leaves_what_it_applied_parked() -> None:
    report = simulate(spec(KeepsReleasedCopies), range(40), first_violation=True)
    assert report.violations, "the planted bug was not found"
    [found] = report.violations.values()
    assert any("still parked" in v and "nothing left waiting" in v for v in found), found


def test_a_users_invariant_runs_beside_the_generic_ones() -> None:
    def every_delivered_parcel_was_dispatched(world: World) -> list[str]:
        return [f"parcel {d['id']} was delivered without a dispatch" for d in world.documents("parcel")
                if d["status"] == "delivered" and "dispatched" not in d]

    def planted(world: World) -> list[str]:
        return [f"parcel {d['id']} is {d['status']}" for d in world.documents("parcel") if d["status"] == "lost"]

    assert not simulate(dataclasses.replace(spec(), invariants=[every_delivered_parcel_was_dispatched]),
                        range(10)).violations
    found = simulate(dataclasses.replace(spec(), invariants=[planted]), range(10), first_violation=True)
    assert any("planted: parcel" in v for vs in found.violations.values() for v in vs)


def test_a_subject_that_does_not_stand_where_its_events_take_it_is_found() -> None:
    from idempotent_consumer.testing import simulation  # noqa: PLC0415 - its invariants, on a world changed by hand

    ordered = spec()
    world, violations = simulation.run(ordered, 1)
    assert not violations
    seconds = {s.body.split(b'"subject": "')[1].split(b'"')[0].decode() for s in world.workload
               if b'b", "source"' in s.body}  # parcels with a second scan at a version: the replay leaves them be
    [parcel, *_] = [d for d in world.documents("parcel") if d["version"] > 1 and d["id"] not in seconds]
    # As if its last applied event's write were lost:
    asyncio.run(world.store.execute_batch(parcel["id"], [Patch(parcel["id"], {"version": parcel["version"] - 1})]))
    mode = ordered.consumer.ordered_queues[ordered.function][1]
    found = simulation._ordered_invariants(world, mode)
    assert any(f"parcel {parcel['id']} stands at" in v and "(in order, once)" in v for v in found), found


class RefusesCopies(Ordered):
    """A planted bug: a copy of an event already applied is dead-lettered InvalidTransition, not completed."""

    async def apply(self, message: InboundMessage, store: DocumentStore) -> Result:
        result = await super().apply(message, store)
        if result.outcome is Outcome.DUPLICATE:
            return Result(Outcome.INVALID_TRANSITION, "planted", result.request_hash)
        return result


def test_it_finds_an_event_dead_lettered_for_a_reason_it_does_not_have() -> None:
    report = simulate(spec(mode_type=RefusesCopies), range(40), first_violation=True)
    found = [v for vs in report.violations.values() for v in vs]
    assert any("ended dead-lettered InvalidTransition" in v and "expected completed" in v for v in found), found


def test_events_refused_at_the_parked_limit_are_not_expected_applied() -> None:
    class Tight(Parcels):
        max_parked = 1

    report = simulate(spec(machine=Tight()), range(30))
    assert report.outcomes["limit_exceeded"] > 0 and not report.violations, report.summary()


def test_the_kit_refuses_a_machine_whose_subjects_it_cannot_replay() -> None:
    class Elsewhere(Parcels):
        creates = False

    with pytest.raises(ValueError, match="creates its subjects"):
        simulate(spec(machine=Elsewhere()), range(1))
