"""The store conformance suite: one contract for every ``DocumentStore``, as Cosmos DB keeps it.

Run it against your own store, or against a container of yours, by subclassing ``StoreConformance`` in a test
module and providing two pytest fixtures: ``store_and_wait`` (a store whose container has TTL on, with default
-1, and how to let a number of seconds pass for it: ``time.sleep`` for a real account, a clock's advance for a
fake) and ``loop`` (an ``asyncio.Runner`` the store's client lives in). ``partition_field`` is the container's
partition key path without its slash::

    class TestLedgerStore(StoreConformance):
        partition_field = "accountId"

        @pytest.fixture
        def store_and_wait(self): ...

The library runs it against its in-memory store (as tests use it, and as the simulation kit pages) and against
the Cosmos DB adapter on the local Cosmos server (``tests/contract/test_document_store.py``): if the fake drifts
from Cosmos DB's behaviour, the same test fails for one of them. pytest is needed for this module only (the
library's ``testing`` extra).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from idempotent_consumer.errors import (
    AlreadyExists,
    BatchFailed,
    BatchTooLarge,
    NotFound,
    PreconditionFailed,
    StoreError,
)
from idempotent_consumer.ports.store import (
    ABSENT,
    MAX_BATCH_BYTES,
    MAX_BATCH_OPERATIONS,
    MAX_ITEM_BYTES,
    MAX_PAGE_ITEMS,
    MAX_PATCH_FIELDS,
    OPERATION_OVERHEAD_BYTES,
    Create,
    Delete,
    DocumentStore,
    Patch,
    Replace,
    query_all,
)
from idempotent_consumer.records import PARTITION_FIELD, merged


def new_id() -> str:
    return f"ord-{uuid.uuid4()}"


# Fields the writer does not set: top level and nested, of every JSON type, as a newer version might add them.
FOREIGN: dict[str, Any] = {"schemaVersion": 2, "loyalty": {"tier": "gold", "points": [1, 2.5, None, True]},
                           "note": "kept"}


def foreign_fields(document: dict[str, Any]) -> dict[str, Any]:
    return {name: document.get(name) for name in FOREIGN}


def _pages(store: DocumentStore, loop: asyncio.Runner, conditions: dict[str, Any], **options: Any) -> list[list[str]]:
    """The ids of each page a query answers with, read to its end."""
    async def read() -> list[list[str]]:
        return [[d["id"] for d in page] async for page in store.query_pages(conditions, **options)]
    return loop.run(read())

class StoreConformance:
    """The contract's tests; a subclass provides the ``store_and_wait`` and ``loop`` fixtures."""

    #: The container's partition key path, without its slash.
    partition_field: str = PARTITION_FIELD

    @property
    def field(self) -> str:
        return self.partition_field

    @pytest.fixture
    def store(self, store_and_wait: tuple[DocumentStore, Callable[[float], None]]) -> DocumentStore:
        return store_and_wait[0]

    def doc(self, doc_id: str, *, partition: str | None = None, **fields: object) -> dict[str, Any]:
        """A document ``doc_id`` in ``partition`` (its own id by default)."""
        return {"id": doc_id, self.field: doc_id if partition is None else partition, **fields}

    def test_create_returns_the_document_with_an_etag(self, store: DocumentStore, loop: asyncio.Runner) -> None:
        order_id = new_id()
        created = loop.run(store.create(self.doc(order_id, total="1.00")))
        assert created["id"] == order_id
        assert created["total"] == "1.00"
        assert created["_etag"]

    def test_read_returns_what_was_created(self, store: DocumentStore, loop: asyncio.Runner) -> None:
        order_id = new_id()
        loop.run(store.create(self.doc(order_id, items=[{"sku": "S", "quantity": 2}])))
        read = loop.run(store.read(order_id, order_id))
        assert read["items"] == [{"sku": "S", "quantity": 2}]

    def test_second_create_of_the_same_id_raises_already_exists_and_keeps_the_first(
        self, store: DocumentStore, loop: asyncio.Runner
    ) -> None:
        order_id = new_id()
        loop.run(store.create(self.doc(order_id, version=1)))
        with pytest.raises(AlreadyExists) as caught:
            loop.run(store.create(self.doc(order_id, version=2)))
        assert caught.value.status == 409
        assert loop.run(store.read(order_id, order_id))["version"] == 1

    def test_read_of_a_missing_document_raises_not_found(self, store: DocumentStore, loop: asyncio.Runner) -> None:
        with pytest.raises(NotFound) as caught:
            loop.run(store.read("no-such-order", "no-such-order"))
        assert caught.value.status == 404

    def test_read_in_another_partition_raises_not_found(self, store: DocumentStore, loop: asyncio.Runner) -> None:
        order_id = new_id()
        loop.run(store.create(self.doc(order_id)))
        with pytest.raises(NotFound):
            loop.run(store.read(order_id, "another-partition"))

    def test_same_id_in_two_partitions_is_two_documents(self, store: DocumentStore, loop: asyncio.Runner) -> None:
        shared_id = new_id()
        loop.run(store.create({"id": shared_id, self.field: "p-1"}))
        loop.run(store.create({"id": shared_id, self.field: "p-2"}))
        assert loop.run(store.read(shared_id, "p-1"))[self.field] == "p-1"
        assert loop.run(store.read(shared_id, "p-2"))[self.field] == "p-2"

    def test_sixteen_concurrent_creates_of_one_id_have_exactly_one_winner(
        self, store: DocumentStore, loop: asyncio.Runner
    ) -> None:
        order_id = new_id()

        async def attempt(start: asyncio.Barrier, n: int) -> str:
            await start.wait()
            try:
                await store.create(self.doc(order_id, writer=n))
            except AlreadyExists:
                return "conflict"
            return "created"

        async def race() -> list[str]:
            start = asyncio.Barrier(16)
            return list(await asyncio.gather(*(attempt(start, n) for n in range(16))))

        results = loop.run(race())
        assert results.count("created") == 1
        assert results.count("conflict") == 15

    def test_batch_writes_every_operation(self, store: DocumentStore, loop: asyncio.Runner) -> None:
        order_id = new_id()
        loop.run(store.execute_batch(order_id, [Create(self.doc(order_id)),
                                                Create({"id": f"{order_id}-m", self.field: order_id})]))
        assert loop.run(store.read(f"{order_id}-m", order_id))[self.field] == order_id
        assert loop.run(store.read(order_id, order_id))["id"] == order_id

    @pytest.mark.parametrize("failing_at", [0, 1, 2])
    def test_batch_that_fails_at_any_operation_writes_nothing(
        self, store: DocumentStore, failing_at: int, loop: asyncio.Runner
    ) -> None:
        order_id = new_id()
        loop.run(store.create(self.doc(f"{order_id}-taken", partition=order_id)))
        ops = [Create({"id": f"{order_id}-{n}", self.field: order_id}) for n in range(3)]
        ops[failing_at] = Create({"id": f"{order_id}-taken", self.field: order_id})
        with pytest.raises(BatchFailed) as caught:
            loop.run(store.execute_batch(order_id, ops))
        assert (caught.value.index, caught.value.status) == (failing_at, 409)
        for n in range(3):
            if n != failing_at:
                with pytest.raises(NotFound):
                    loop.run(store.read(f"{order_id}-{n}", order_id))

    def test_conditional_patch_applies_when_the_condition_holds(
        self, store: DocumentStore, loop: asyncio.Runner
    ) -> None:
        order_id = new_id()
        loop.run(store.create(self.doc(order_id, version=1, status="placed")))
        loop.run(store.execute_batch(order_id, [Patch(order_id, {"version": 2, "status": "paid"},
                                                      {"version": 1, "status": ("placed", "paid")})]))
        stored = loop.run(store.read(order_id, order_id))
        assert (stored["version"], stored["status"]) == (2, "paid")

    def test_a_patch_sets_a_field_inside_an_object_and_keeps_the_objects_other_fields(
        self, store: DocumentStore, loop: asyncio.Runner
    ) -> None:
        order_id = new_id()
        loop.run(store.create(self.doc(order_id, payment={"amount": "5", "card": {"last4": "4242"}})))
        loop.run(store.execute_batch(order_id, [Patch(order_id, {"payment/review": {"by": "fraud"},
                                                                 "payment/card/brand": "visa"})]))
        assert loop.run(store.read(order_id, order_id))["payment"] == {
            "amount": "5", "card": {"last4": "4242", "brand": "visa"}, "review": {"by": "fraud"}}

    def test_a_patch_inside_an_object_that_is_not_there_is_400_and_writes_nothing(
        self, store: DocumentStore, loop: asyncio.Runner
    ) -> None:
        order_id = new_id()
        loop.run(store.create(self.doc(order_id, version=1)))
        marker = Create({"id": f"{order_id}-marker", self.field: order_id})
        with pytest.raises(BatchFailed) as caught:
            loop.run(store.execute_batch(order_id, [marker, Patch(order_id, {"payment/review": "ok"})]))
        assert caught.value.index == 1 and caught.value.error.status == 400
        assert not isinstance(caught.value.error, PreconditionFailed | NotFound)
        assert "payment" not in loop.run(store.read(order_id, order_id))
        with pytest.raises(NotFound):
            loop.run(store.read(f"{order_id}-marker", order_id))

    def test_a_patch_on_a_field_being_absent_applies_while_it_is_and_fails_412_once_it_is_there(
        self, store: DocumentStore, loop: asyncio.Runner
    ) -> None:
        order_id = new_id()
        loop.run(store.create(self.doc(order_id, version=1)))
        loop.run(store.execute_batch(order_id, [Patch(order_id, {"payment": {"amount": "5"}},
                                                      {"version": 1, "payment": ABSENT})]))
        with pytest.raises(BatchFailed) as caught:
            loop.run(store.execute_batch(order_id, [Patch(order_id, {"payment": {"amount": "9"}},
                                                          {"payment": ABSENT})]))
        assert isinstance(caught.value.error, PreconditionFailed)
        assert loop.run(store.read(order_id, order_id))["payment"] == {"amount": "5"}
        loop.run(store.execute_batch(order_id, [Patch(order_id, {"note": None}, {"note": ABSENT})]))
        with pytest.raises(BatchFailed):  # a field set to null is defined
            loop.run(store.execute_batch(order_id, [Patch(order_id, {"note": "x"}, {"note": ABSENT})]))

    @pytest.mark.parametrize("condition", [{"version": 2}, {"status": ("cancelled", "shipped")}, {"Version": 1}])
    def test_conditional_patch_fails_412_and_writes_nothing_when_the_condition_fails(
        self, store: DocumentStore, condition: dict[str, Any], loop: asyncio.Runner
    ) -> None:
        order_id = new_id()
        loop.run(store.create(self.doc(order_id, version=1, status="placed")))
        marker = Create({"id": f"{order_id}-marker", self.field: order_id})
        with pytest.raises(BatchFailed) as caught:
            loop.run(store.execute_batch(order_id, [marker, Patch(order_id, {"version": 9}, condition)]))
        assert caught.value.index == 1 and isinstance(caught.value.error, PreconditionFailed)
        assert loop.run(store.read(order_id, order_id))["version"] == 1
        with pytest.raises(NotFound):
            loop.run(store.read(f"{order_id}-marker", order_id))

    def test_a_condition_on_a_path_into_an_object_holds_of_its_field(
        self, store: DocumentStore, loop: asyncio.Runner
    ) -> None:
        order_id = new_id()
        loop.run(store.create(self.doc(order_id, claim={"rev": 1, "status": "in_progress"})))
        [patched] = loop.run(store.execute_batch(order_id, [Patch(order_id, {"claim/rev": 2}, {"claim/rev": 1})]))
        assert patched["claim"] == {"rev": 2, "status": "in_progress"}
        for condition in ({"claim/rev": 1}, {"claim/status": ("completed",)}, {"claim/rev": ABSENT},
                          {"other/rev": 2}):
            with pytest.raises(BatchFailed) as caught:
                loop.run(store.execute_batch(order_id, [Patch(order_id, {"claim/rev": 9}, condition)]))
            assert isinstance(caught.value.error, PreconditionFailed), condition
        loop.run(store.execute_batch(order_id, [Patch(order_id, {"note": 1}, {"other/rev": ABSENT,
                                                                              "claim/note": ABSENT})]))
        assert loop.run(store.read(order_id, order_id))["claim"]["rev"] == 2

    def test_patch_of_a_missing_document_fails_404(self, store: DocumentStore, loop: asyncio.Runner) -> None:
        order_id = new_id()
        with pytest.raises(BatchFailed) as caught:
            loop.run(store.execute_batch(order_id, [Patch(order_id, {"version": 2}, {"version": 1})]))
        assert isinstance(caught.value.error, NotFound)

    def test_patch_on_the_etag_applies_while_it_is_current_and_fails_412_after_a_write(
        self, store: DocumentStore, loop: asyncio.Runner
    ) -> None:
        order_id = new_id()
        created = loop.run(store.create(self.doc(order_id, attempt=1)))
        [patched] = loop.run(store.execute_batch(order_id, [Patch(order_id, {"attempt": 2},
                                                                   if_match=created["_etag"])]))
        assert patched["attempt"] == 2 and patched["_etag"] != created["_etag"]
        with pytest.raises(BatchFailed) as caught:
            loop.run(store.execute_batch(order_id, [Patch(order_id, {"attempt": 3}, if_match=created["_etag"])]))
        assert isinstance(caught.value.error, PreconditionFailed)
        assert loop.run(store.read(order_id, order_id))["attempt"] == 2

    def test_patch_on_the_etag_of_a_missing_document_fails_404(
        self, store: DocumentStore, loop: asyncio.Runner
    ) -> None:
        order_id = new_id()
        with pytest.raises(BatchFailed) as caught:
            loop.run(store.execute_batch(order_id, [Patch(order_id, {"attempt": 2}, if_match='"gone"')]))
        assert isinstance(caught.value.error, NotFound)

    def test_patch_with_a_condition_and_an_etag_needs_both(self, store: DocumentStore, loop: asyncio.Runner) -> None:
        order_id = new_id()
        created = loop.run(store.create(self.doc(order_id, status="parked")))
        for condition, etag in [({"status": "dropped"}, created["_etag"]), ({"status": "parked"}, '"stale"')]:
            with pytest.raises(BatchFailed) as caught:
                loop.run(store.execute_batch(order_id, [Patch(order_id, {"status": "rejected"}, condition, etag)]))
            assert isinstance(caught.value.error, PreconditionFailed)
        loop.run(store.execute_batch(order_id, [Patch(order_id, {"status": "rejected"}, {"status": "parked"},
                                                      created["_etag"])]))
        assert loop.run(store.read(order_id, order_id))["status"] == "rejected"

    def test_a_patch_of_more_fields_than_cosmos_takes_is_refused_before_sending(
        self, store: DocumentStore, loop: asyncio.Runner
    ) -> None:
        order_id = new_id()
        loop.run(store.create(self.doc(order_id)))
        fields = {f"f{n}": n for n in range(MAX_PATCH_FIELDS + 1)}
        with pytest.raises(StoreError) as caught:
            loop.run(store.execute_batch(order_id, [Patch(order_id, fields)]))
        assert caught.value.status == 400 and "at most 10" in str(caught.value)
        loop.run(store.execute_batch(order_id, [Patch(order_id, dict(list(fields.items())[:MAX_PATCH_FIELDS]))]))
        assert loop.run(store.read(order_id, order_id))["f9"] == 9

    def _sized(self, doc_id: str, order_id: str, size: int) -> dict[str, Any]:
        """A document whose JSON is exactly ``size`` bytes, as the limit counts them."""
        document = {"id": doc_id, self.field: order_id, "blob": ""}
        document["blob"] = "x" * (size - len(msgspec.json.encode(document)))
        assert len(msgspec.json.encode(document)) == size
        return document

    def test_an_item_of_2_mb_is_stored_and_one_byte_more_is_refused_before_sending(
        self, store: DocumentStore, loop: asyncio.Runner
    ) -> None:
        order_id = new_id()
        largest = self._sized(order_id, order_id, MAX_ITEM_BYTES)
        loop.run(store.create(largest))
        assert loop.run(store.read(order_id, order_id))["blob"] == largest["blob"]
        with pytest.raises(BatchTooLarge) as refused:
            loop.run(store.create(self._sized(f"{order_id}-over", order_id, MAX_ITEM_BYTES + 1)))
        assert "item" in refused.value.limit and str(MAX_ITEM_BYTES) in str(refused.value)
        with pytest.raises(NotFound):
            loop.run(store.read(f"{order_id}-over", order_id))

    def test_a_batch_of_2_mb_is_written_and_one_byte_more_is_refused_before_sending(
        self, store: DocumentStore, loop: asyncio.Runner
    ) -> None:
        # As the limit counts a batch: each operation's document or fields, and its overhead.
        order_id = new_id()
        size = MAX_BATCH_BYTES - OPERATION_OVERHEAD_BYTES
        loop.run(store.execute_batch(order_id, [Create(self._sized(order_id, order_id, size))]))
        with pytest.raises(BatchTooLarge) as refused:
            loop.run(store.execute_batch(order_id, [Create(self._sized(f"{order_id}-over", order_id, size + 1))]))
        assert "transactional batch" in refused.value.limit
        with pytest.raises(NotFound):
            loop.run(store.read(f"{order_id}-over", order_id))

    def test_a_batch_of_100_operations_is_written_and_one_of_101_refused_before_sending(
        self, store: DocumentStore, loop: asyncio.Runner
    ) -> None:
        order_id = new_id()
        loop.run(store.execute_batch(order_id, [Create(self.doc(f"{order_id}-{n}", partition=order_id))
                                                for n in range(MAX_BATCH_OPERATIONS)]))
        assert len(loop.run(query_all(store, {}, partition_key=order_id))) == MAX_BATCH_OPERATIONS
        with pytest.raises(BatchTooLarge) as refused:
            loop.run(store.execute_batch(order_id, [Create(self.doc(f"{order_id}-more-{n}", partition=order_id))
                                                    for n in range(MAX_BATCH_OPERATIONS + 1)]))
        assert "100 operations" in refused.value.limit
        assert len(loop.run(query_all(store, {}, partition_key=order_id))) == MAX_BATCH_OPERATIONS

    @pytest.mark.parametrize("how", ["condition", "etag", "condition and etag", "neither"])
    def test_a_patch_keeps_every_field_it_does_not_set_and_returns_the_whole_document(
        self, store: DocumentStore, loop: asyncio.Runner, how: str
    ) -> None:
        order_id = new_id()
        created = loop.run(store.create(self.doc(order_id, version=1, status="placed", **FOREIGN)))
        condition = {"version": 1} if "condition" in how else {}
        etag = created["_etag"] if "etag" in how else None
        [written] = loop.run(store.execute_batch(order_id, [Patch(order_id, {"version": 2}, condition, etag)]))
        stored = loop.run(store.read(order_id, order_id))
        assert foreign_fields(stored) == FOREIGN and (stored["version"], stored["status"]) == (2, "placed")
        assert {k: v for k, v in written.items() if k != "_ts"} == {k: v for k, v in stored.items() if k != "_ts"}

    def test_a_batch_of_patches_keeps_the_fields_of_every_document_it_patches(
        self, store: DocumentStore, loop: asyncio.Runner
    ) -> None:
        order_id = new_id()
        first = loop.run(store.create(self.doc(order_id, version=1, **FOREIGN)))
        loop.run(store.create(self.doc(f"{order_id}-parked", partition=order_id, status="parked", **FOREIGN)))
        written = loop.run(store.execute_batch(order_id, [
            Create(self.doc(f"{order_id}-marker", partition=order_id)),
            Patch(order_id, {"version": 2, "parked": 0}, if_match=first["_etag"]),
            Patch(f"{order_id}-parked", {"status": "rejected", "reason": "why"}, {"status": "parked"})]))
        assert [foreign_fields(d) for d in written[1:]] == [FOREIGN, FOREIGN]
        for doc_id in (order_id, f"{order_id}-parked"):
            assert foreign_fields(loop.run(store.read(doc_id, order_id))) == FOREIGN
        assert loop.run(store.read(f"{order_id}-parked", order_id))["reason"] == "why"

    @pytest.mark.parametrize("alone", [True, False], ids=["alone", "in a batch"])
    def test_an_etag_only_patch_returns_the_id_and_the_new_etag_and_keeps_every_field(
        self, store: DocumentStore, loop: asyncio.Runner, alone: bool
    ) -> None:
        order_id = new_id()
        created = loop.run(store.create(self.doc(order_id, version=1, status="placed", **FOREIGN)))
        others = [] if alone else [Create(self.doc(f"{order_id}-marker", partition=order_id))]
        *_, written = loop.run(store.execute_batch(order_id, [
            *others, Patch(order_id, {"version": 2}, {"status": "placed"}, created["_etag"], etag_only=True)]))
        stored = loop.run(store.read(order_id, order_id))
        assert written == {"id": order_id, "_etag": stored["_etag"]} and stored["_etag"] != created["_etag"]
        assert foreign_fields(stored) == FOREIGN and (stored["version"], stored["status"]) == (2, "placed")
        # The etag returned is the one to write on next.
        loop.run(store.execute_batch(order_id, [Patch(order_id, {"version": 3}, if_match=written["_etag"],
                                                      etag_only=True)]))
        assert loop.run(store.read(order_id, order_id))["version"] == 3

    @pytest.mark.parametrize("why", ["stale etag", "condition false", "missing"])
    def test_an_etag_only_patch_alone_fails_as_the_batch_of_it_and_writes_nothing(
        self, store: DocumentStore, loop: asyncio.Runner, why: str
    ) -> None:
        order_id = new_id()
        created = {} if why == "missing" else loop.run(store.create(self.doc(order_id, version=1)))
        etag, condition = {"stale etag": ('"stale"', {}), "condition false": (created.get("_etag"), {"version": 7}),
                           "missing": ('"gone"', {})}[why]
        with pytest.raises(BatchFailed) as caught:
            loop.run(store.execute_batch(order_id, [Patch(order_id, {"version": 2}, condition, etag, etag_only=True)]))
        assert caught.value.index == 0
        assert isinstance(caught.value.error, NotFound if why == "missing" else PreconditionFailed)
        if created:
            assert loop.run(store.read(order_id, order_id)) == created

    def test_a_replace_merged_into_the_document_as_read_keeps_the_fields_it_does_not_set(
        self, store: DocumentStore, loop: asyncio.Runner
    ) -> None:
        order_id = new_id()
        read = loop.run(store.create(self.doc(order_id, type="order-pending", parked=1, **FOREIGN)))
        changes = {"type": "order", "status": "placed", "version": 1, "parked": 0, "schemaVersion": 1}
        loop.run(store.execute_batch(order_id, [Replace(merged(read, changes), if_match=read["_etag"])]))
        stored = loop.run(store.read(order_id, order_id))
        # Every foreign field kept; schemaVersion is the merge's: the body it wrote is this version's shape.
        assert foreign_fields(stored) == {**FOREIGN, "schemaVersion": 1}
        assert (stored["type"], stored["status"], stored["parked"]) == ("order", "placed", 0)

    def test_replace_needs_the_current_etag(self, store: DocumentStore, loop: asyncio.Runner) -> None:
        order_id = new_id()
        created = loop.run(store.create(self.doc(order_id, attempt=1)))
        loop.run(store.execute_batch(order_id, [Replace(self.doc(order_id, attempt=2), if_match=created["_etag"])]))
        with pytest.raises(BatchFailed) as caught:
            loop.run(store.execute_batch(order_id, [Replace(self.doc(order_id, attempt=3), if_match=created["_etag"])]))
        assert isinstance(caught.value.error, PreconditionFailed)
        assert loop.run(store.read(order_id, order_id))["attempt"] == 2

    def test_batch_over_100_operations_is_refused_before_sending(
        self, store: DocumentStore, loop: asyncio.Runner
    ) -> None:
        order_id = new_id()
        ops = [Create({"id": f"{order_id}-{n}", self.field: order_id}) for n in range(MAX_BATCH_OPERATIONS + 1)]
        with pytest.raises(BatchTooLarge):
            loop.run(store.execute_batch(order_id, ops))
        with pytest.raises(NotFound):
            loop.run(store.read(f"{order_id}-0", order_id))

    def test_batch_over_2_mb_is_refused_before_sending(self, store: DocumentStore, loop: asyncio.Runner) -> None:
        order_id = new_id()
        big = "x" * (1024 * 1024)
        ops = [Create({"id": f"{order_id}-{n}", self.field: order_id, "pad": big}) for n in range(2)]
        with pytest.raises(BatchTooLarge):
            loop.run(store.execute_batch(order_id, ops))

    def test_document_with_ttl_expires_and_others_remain(
        self, store_and_wait: tuple[DocumentStore, Callable[[float], None]], loop: asyncio.Runner,
    ) -> None:
        store, wait = store_and_wait
        order_id = new_id()
        loop.run(store.execute_batch(order_id, [Create(self.doc(f"{order_id}-marker", partition=order_id, ttl=1)),
                                                Create(self.doc(order_id))]))
        deadline = time.monotonic() + 10
        while True:
            wait(1.1)
            try:
                loop.run(store.read(f"{order_id}-marker", order_id))
            except NotFound:
                break
            assert time.monotonic() < deadline, "the marker should have expired"
        assert loop.run(store.read(order_id, order_id))["id"] == order_id
        # An expired id can be created again.
        loop.run(store.create(self.doc(f"{order_id}-marker", partition=order_id)))

    def test_query_finds_matching_documents_across_partitions(self, store: DocumentStore, loop: asyncio.Runner) -> None:
        tag = uuid.uuid4().hex
        for n, status in enumerate(["pending", "pending", "dispatched", "pending"]):
            order_id = new_id()
            loop.run(store.create({"id": f"{order_id}-outbox", self.field: order_id, "type": f"outbox-{tag}",
                                   "status": status, "createdAt": 100.0 + n}))
        found = loop.run(query_all(store, {"type": f"outbox-{tag}", "status": "pending"}, before=("createdAt", 103.0)))
        assert sorted(d["createdAt"] for d in found) == [100.0, 101.0]
        assert len(loop.run(query_all(store, {"type": f"outbox-{tag}"}))) == 4
        assert loop.run(query_all(store, {"type": f"outbox-{tag}", "status": "lost"})) == []

    @pytest.mark.parametrize("scoped", [True, False], ids=["in one partition", "across partitions"])
    def test_a_query_answers_in_pages_of_at_most_the_size_asked_for_and_the_pages_hold_everything_once(
        self, store: DocumentStore, loop: asyncio.Runner, scoped: bool
    ) -> None:
        tag, order_id = uuid.uuid4().hex, new_id()
        ids = {f"{order_id}-{n:03d}" for n in range(2 * MAX_PAGE_ITEMS + 5)}
        for doc_id in sorted(ids):
            loop.run(store.create({"id": doc_id, self.field: order_id if scoped else doc_id, "type": tag}))
        pages = _pages(store, loop, {"type": tag}, partition_key=order_id if scoped else None)
        assert all(len(page) <= MAX_PAGE_ITEMS for page in pages) and len([p for p in pages if p]) >= 3
        assert sorted(i for page in pages for i in page) == sorted(ids)  # nothing missed, nothing twice
        small = _pages(store, loop, {"type": tag}, partition_key=order_id if scoped else None, page_size=7)
        assert all(len(page) <= 7 for page in small) and sorted(i for page in small for i in page) == sorted(ids)

    def test_documents_removed_while_the_pages_are_read_miss_none_of_the_rest(
        self, store: DocumentStore, loop: asyncio.Runner
    ) -> None:
        # A release deletes what it applied while a later page is still to come; the continuation resumes
        # after the last document given, not at a count, so nothing that stays is skipped.
        tag, order_id = uuid.uuid4().hex, new_id()
        for n in range(25):
            loop.run(store.create({"id": f"{order_id}-{n:02d}", self.field: order_id, "type": tag}))

        async def read_and_delete() -> list[str]:
            seen: list[str] = []
            async for page in store.query_pages({"type": tag}, partition_key=order_id, page_size=10):
                seen += [d["id"] for d in page]
                if page:  # a page may be empty while more follow
                    await store.execute_batch(order_id, [Delete(d["id"]) for d in page])
            return seen

        assert sorted(loop.run(read_and_delete())) == [f"{order_id}-{n:02d}" for n in range(25)]
        assert loop.run(query_all(store, {"type": tag}, partition_key=order_id)) == []

    def test_delete_in_a_batch_removes_the_document_with_the_other_writes(
        self, store: DocumentStore, loop: asyncio.Runner
    ) -> None:
        order_id = new_id()
        created = loop.run(store.create(self.doc(f"{order_id}-parked", partition=order_id)))
        loop.run(store.execute_batch(order_id, [Create(self.doc(order_id)),
                                                Delete(f"{order_id}-parked", if_match=created["_etag"])]))
        assert loop.run(store.read(order_id, order_id))["id"] == order_id
        with pytest.raises(NotFound):
            loop.run(store.read(f"{order_id}-parked", order_id))

    def test_delete_with_a_stale_etag_or_of_a_missing_document_fails_and_writes_nothing(
        self, store: DocumentStore, loop: asyncio.Runner
    ) -> None:
        order_id = new_id()
        created = loop.run(store.create(self.doc(f"{order_id}-parked", partition=order_id, n=1)))
        loop.run(store.execute_batch(order_id, [Replace(self.doc(f"{order_id}-parked", partition=order_id, n=2))]))
        with pytest.raises(BatchFailed) as stale:
            loop.run(store.execute_batch(order_id, [Create(self.doc(order_id)),
                                                    Delete(f"{order_id}-parked", if_match=created["_etag"])]))
        assert stale.value.index == 1 and isinstance(stale.value.error, PreconditionFailed)
        with pytest.raises(BatchFailed) as missing:
            loop.run(store.execute_batch(order_id, [Create(self.doc(order_id)), Delete(f"{order_id}-gone")]))
        assert missing.value.index == 1 and isinstance(missing.value.error, NotFound)
        with pytest.raises(NotFound):
            loop.run(store.read(order_id, order_id))
        assert loop.run(store.read(f"{order_id}-parked", order_id))["n"] == 2

    def test_query_can_stay_in_one_partition(self, store: DocumentStore, loop: asyncio.Runner) -> None:
        tag = uuid.uuid4().hex
        first, second = new_id(), new_id()
        for order_id in (first, first, second):
            loop.run(store.create({"id": f"{order_id}-{uuid.uuid4().hex}", self.field: order_id, "type": tag}))
        assert len(loop.run(query_all(store, {"type": tag}, partition_key=first))) == 2
        assert len(loop.run(query_all(store, {"type": tag}, partition_key=second))) == 1
        assert len(loop.run(query_all(store, {"type": tag}))) == 3
