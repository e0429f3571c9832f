"""Another writer of the container keeps every field it does not own, and the run finds a field the app dropped.

The foreign writers (``simulation.foreign``) add fields this version of the app does not model; the
``foreign-fields`` invariant asks that each is there at the end with the last value written, unless its
document was deleted or expired by design.
"""

from __future__ import annotations

from typing import Any

from idempotent_consumer.ports.store import Create, Delete, Document, Patch, Replace
from simulation import foreign
from simulation.invariants import Violation, foreign_fields_kept
from simulation.scheduler import drive
from simulation.world import Wiring, World

ORDER = {"id": "ord-1", "orderId": "ord-1", "type": "order", "status": "placed", "version": 2,
         "items": [{"sku": "a", "quantity": 1}], "payment": {"paymentId": "p-1"}}


def world_with(document: Document) -> World:
    """A run's world, before its actors start, whose store holds ``document`` as the app created it."""
    world = World(0, Wiring(), trace=True)
    written = drive(world.store.create(document))
    world.history.wrote(document["orderId"], [Create(document)], [written])
    return world


def foreign_patch(world: World, doc_id: str, fields: dict[str, Any]) -> None:
    """A foreign writer's patch of ``fields``, noted as the foreign writers note theirs."""
    operation = Patch(doc_id, fields)
    [written] = drive(world.store.execute_batch("ord-1", [operation]))
    world.history.wrote_foreign("ord-1", operation, written, fields)


def app_replace(world: World, document: Document) -> None:
    """The app's replace of a whole document on its etag."""
    current = drive(world.store.read(document["id"], "ord-1"))
    operation = Replace(document, current["_etag"])
    written = drive(world.store.execute_batch("ord-1", [operation]))
    world.history.wrote("ord-1", [operation], written)


def violations(world: World) -> list[Violation]:
    return list(foreign_fields_kept(world, world.store.documents()))


def test_a_foreign_writer_keeps_every_field_it_does_not_own_by_patch_and_by_replace_on_the_etag() -> None:
    world = world_with(dict(ORDER))
    writer = foreign.Operator(world)

    def eight_touches() -> None:
        for _ in range(8):
            writer.touch(("ord-1", "ord-1"))

    world.sched.spawn("operator", eight_touches)
    assert world.sched.run(lambda: True, deadline=world.clock.now + 1)
    stored = drive(world.store.read("ord-1", "ord-1"))
    assert {name: stored[name] for name in ORDER} == ORDER
    assert stored["opsNote"] == "checked by operations, #8"
    assert world.history.foreign[("ord-1", "ord-1")] == {"opsNote": "checked by operations, #8"}
    verbs = " ".join(world.sched.trace_lines or [])
    assert "foreign patch order" in verbs and "foreign replace on etag order" in verbs
    assert violations(world) == []


def test_a_foreign_field_the_app_drops_is_reported_with_the_documents_id_kind_and_field() -> None:
    world = world_with(dict(ORDER))
    foreign_patch(world, "ord-1", {"opsNote": "kept?", "riskScore": 7})
    app_replace(world, {**ORDER, "riskScore": 7, "status": "paid"})  # rewritten from a model that lacks opsNote
    assert [str(v) for v in violations(world)] == [
        "foreign-fields: order ord-1 of ord-1: field opsNote was dropped (a foreign writer last wrote 'kept?')"]


def test_a_foreign_field_the_app_writes_back_stale_is_reported_with_both_values() -> None:
    world = world_with(dict(ORDER))
    foreign_patch(world, "ord-1", {"riskScore": 1})
    stale = drive(world.store.read("ord-1", "ord-1"))
    foreign_patch(world, "ord-1", {"riskScore": 2})
    app_replace(world, {k: v for k, v in stale.items() if not k.startswith("_")})
    [violation] = violations(world)
    assert violation.detail == "order ord-1 of ord-1: field riskScore holds 1, not 2, which a foreign writer wrote last"


def test_a_document_deleted_or_expired_takes_its_foreign_fields_with_it() -> None:
    world = world_with({"id": "parked-1", "orderId": "ord-1", "type": "parked-event"})
    marker = {"id": "inbox-1", "orderId": "ord-1", "type": "inbox", "ttl": 60}
    world.history.wrote("ord-1", [Create(marker)], [drive(world.store.create(marker))])
    foreign_patch(world, "parked-1", {"opsNote": "a"})
    foreign_patch(world, "inbox-1", {"opsNote": "b"})
    deleted = drive(world.store.execute_batch("ord-1", [Delete("parked-1")]))
    world.history.wrote("ord-1", [Delete("parked-1")], deleted)
    world.clock.now += 61
    assert violations(world) == []
