"""The other writers of the container: an enrichment job and an operator's script, adding fields the app does not model.

Anyone with access may write the orders container: an enrichment job that follows the change feed, an
operator's script, the next version of the app during a rolling upgrade. They write what they own and
keep the rest, as a careful writer does: a read, then a replace of the document as read with their fields
set, on its etag (retried on a 412); or a patch of their fields alone. Either may land between the app's
read and its conditional write, which then fails with a 412 and must read again.

They write inside the objects the app models too: a review into an order's ``payment``, ``shipment`` or
``cancellation`` (whether or not the app has set it yet: a patch by path where the object stands, a replace
that adds the object where it does not), and a ``channel`` into an outbox entry's ``payload``. A field's
name is its path (``payment/review``).

They write through the in-memory store itself, not the faulty proxy (their own failures are not under
test), and are scheduled like every actor: each store call is an interleaving point. What they wrote last
goes into ``History.foreign``, where the ``foreign-fields`` invariant finds it at the end.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from typing import Any

from idempotent_consumer.errors import BatchFailed, NotFound, PreconditionFailed
from idempotent_consumer.ports.store import Document, Patch, Replace
from simulation.scheduler import drive
from simulation.world import World

ENRICHED_SHARE = 0.3  # of the documents the app writes, the share the enrichment job writes on after it
OPERATOR_PERIOD_SECONDS = (5.0, 120.0)  # between two documents the operator's script touches
PATCH_SHARE = 0.5  # of the foreign writes, the share done as a patch; the rest read, then replace on the etag
MAX_ATTEMPTS = 3  # replaces on the etag before a writer that keeps losing the race gives up
NESTED_SHARE = 0.5  # of the enrichment job's writes on an order or an outbox entry, the share inside a sub-object
SUB_OBJECTS = ("payment", "shipment", "cancellation")
_Key = tuple[str, str]
_Fields = Callable[[int, random.Random, _Key], dict[str, Any]]  # (serial, rng, doc) -> the paths one write sets


def start(world: World) -> None:
    """Spawn the foreign writers of the run."""
    world.sched.spawn("enrichment-job", Enricher(world).run)
    world.sched.spawn("operator", Operator(world).run)


def _enrichment(serial: int, rng: random.Random, key: _Key) -> dict[str, Any]:
    fields: dict[str, Any] = {"enrichment": {"source": "enrichment-job", "revision": serial}}
    if rng.random() < 0.5:
        fields["riskScore"] = serial % 100
    if rng.random() < NESTED_SHARE:
        if key[0] == key[1]:  # the order, or the pending order standing in for it
            fields[f"{rng.choice(SUB_OBJECTS)}/review"] = {"by": "enrichment-job", "revision": serial}
        elif key[1].startswith("outbox."):
            fields["payload/channel"] = f"web-{serial}"
    return fields


def _operator_note(serial: int, rng: random.Random, key: _Key) -> dict[str, Any]:
    return {"opsNote": f"checked by operations, #{serial}"}


def with_paths(document: Document, fields: dict[str, Any]) -> Document:
    """The document with each path in ``fields`` set, the objects on the way made where they are missing."""
    result = dict(document)
    for path, value in fields.items():
        *parents, last = path.split("/")
        target = result
        for name in parents:
            child = target.get(name)
            target[name] = target = dict(child) if isinstance(child, dict) else {}
        target[last] = value
    return result


def at_path(document: Document, path: str) -> tuple[bool, Any]:
    """Whether the path is in the document, and its value there."""
    node: Any = document
    for name in path.split("/"):
        if not isinstance(node, dict) or name not in node:
            return False, None
        node = node[name]
    return True, node


class ForeignWriter:
    """Writes its own fields on a document and keeps every other, by patch or by replace on the etag."""

    def __init__(self, world: World, fields: _Fields) -> None:
        self.world = world
        self._fields = fields
        self._serials = itertools.count(1)

    def touch(self, key: _Key) -> None:
        """Write this writer's fields on one document, if it still exists."""
        rng = self.world.sched.rng
        changes = self._fields(next(self._serials), rng, key)
        if rng.random() < PATCH_SHARE:
            self._patch(key, changes)
        else:
            self._replace(key, changes)

    def _patch(self, key: _Key, changes: dict[str, Any]) -> None:
        partition_key, doc_id = key
        operation = Patch(doc_id, changes)
        self.world.sched.pause()
        try:
            [written] = drive(self.world.store.execute_batch(partition_key, [operation]))
        except BatchFailed as exc:
            if exc.error.status == 400 and any("/" in path for path in changes):
                self._replace(key, changes)  # an object on a path is not there yet: add it with the document as read
                return
            if not isinstance(exc.error, NotFound):
                raise
            self._gone(key)
            return
        self._wrote(key, operation, written, changes)

    def _replace(self, key: _Key, changes: dict[str, Any]) -> None:
        partition_key, doc_id = key
        world, stats = self.world, self.world.foreign_stats
        for _ in range(MAX_ATTEMPTS):
            world.sched.pause()
            try:
                document = drive(world.store.read(doc_id, partition_key))
            except NotFound:
                self._gone(key)
                return
            # Every field as read, the store's own (_etag, _ts, ...) left to it, and ours set.
            kept = {name: value for name, value in document.items() if not name.startswith("_")}
            operation = Replace(with_paths(kept, changes), document["_etag"])
            world.sched.pause()
            try:
                [written] = drive(world.store.execute_batch(partition_key, [operation]))
            except BatchFailed as exc:
                if isinstance(exc.error, PreconditionFailed):
                    stats["writer_412"] += 1
                    if world.sched.trace_lines is not None:
                        world.sched.trace(f"foreign replace on {doc_id[:24]}: 412, the document changed; again")
                    continue
                if isinstance(exc.error, NotFound):
                    self._gone(key)
                    return
                raise
            self._wrote(key, operation, written, changes)
            return
        stats["gave_up"] += 1

    def _wrote(self, key: _Key, operation: Patch | Replace, written: Document, changes: dict[str, Any]) -> None:
        world = self.world
        world.history.wrote_foreign(key[0], operation, written, changes)
        world.foreign_writes[str(written.get("type", "?"))] += 1
        if world.sched.trace_lines is not None:
            verb = "patch" if isinstance(operation, Patch) else "replace on etag"
            world.sched.trace(f"foreign {verb} {written.get('type')} {key[1][:24]}: {changes}")

    def _gone(self, key: _Key) -> None:
        self.world.foreign_stats["gone"] += 1
        if self.world.sched.trace_lines is not None:
            self.world.sched.trace(f"foreign write on {key[1][:24]}: the document is gone")


class Enricher(ForeignWriter):
    """An enrichment job on the change feed: soon after the app writes a document, it sometimes writes on it."""

    def __init__(self, world: World) -> None:
        super().__init__(world, _enrichment)

    def run(self) -> None:
        """Follow the app's writes forever; at once, so that it races the app's next write."""
        world, sched = self.world, self.world.sched
        while True:
            while not world.history.changes:
                sched.wait(world.changed)
            for key in world.history.take_changes():
                if sched.rng.random() < ENRICHED_SHARE:
                    self.touch(key)


class Operator(ForeignWriter):
    """An operator's script: at random moments, a note on a random document of the container."""

    def __init__(self, world: World) -> None:
        super().__init__(world, _operator_note)

    def run(self) -> None:
        """Touch a random document every so often, forever."""
        world, sched = self.world, self.world.sched
        while True:
            sched.sleep(sched.rng.uniform(*OPERATOR_PERIOD_SECONDS))
            if world.history.documents:
                self.touch(sched.rng.choice(list(world.history.documents)))
