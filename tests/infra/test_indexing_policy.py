"""The orders container's indexing policy indexes what the app's queries filter on, and nothing else.

The queries are taken from the handlers themselves (each run over a store that records what it is
asked), so a new query or a new condition fails here until the policy indexes it. Bicep loads the
policy file (``loadJsonContent``) and the local setup applies the same file; on a container made with
it, every recorded query still finds what it should.
"""

from __future__ import annotations

import ast
import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pycep import BicepParser

from bench import index_terms
from devservers import cosmos_setup
from idempotent_consumer import migrations, reports
from idempotent_consumer.adapters.cosmos import CosmosStore, query_text
from idempotent_consumer.errors import BatchFailed
from idempotent_consumer.ordered import operator as operator_commands
from idempotent_consumer.ordered import writes
from idempotent_consumer.outbox import OutboxPublisher
from idempotent_consumer.ports.store import BatchOperation, Delete, Document, query_all
from idempotent_consumer.testing.memory import RecordingSender
from shared.settings import Settings
from tests.support.cosmos import CosmosEndpoint, make_cosmos_client

ROOT = Path(__file__).resolve().parents[2]
COSMOS_BICEP = ROOT / "infra" / "modules" / "cosmos.bicep"
POLICY_FILE = ROOT / "infra" / "orders-indexing-policy.json"
POLICY = json.loads(POLICY_FILE.read_text())
# Handler modules and how many store queries each makes; a new one must be run in ``app_queries`` too.
QUERY_SITES = {"writes.py": 1, "operator.py": 1, "outbox.py": 1, "reports.py": 3, "migrations.py": 1}
MIGRATING_FILE = ROOT / "infra" / "orders-indexing-policy-migrating.json"
# What the release before the lean policy queried: the migrating policy keeps it indexed beside the lean one.
BEFORE_LEAN = {"/status/?", "/consumer/?", "/createdAt/?", "/parkedAt/?", "/leaseUntil/?"}
PERFORMANCE = ROOT / "docs" / "performance.md"


@dataclass(frozen=True)
class Query:
    """One query as a handler asks the store for it."""

    conditions: dict[str, Any]
    partition_key: str | None
    before: tuple[str, Any] | None

    def fields(self) -> set[str]:
        return set(self.conditions) | ({self.before[0]} if self.before else set())


class QueryRecorder:
    """A DocumentStore that records each query and finds nothing; the query handlers' only call."""

    def __init__(self) -> None:
        self.queries: list[Query] = []

    async def query_pages(self, conditions: Mapping[str, Any], *, partition_key: str | None = None,
                          before: tuple[str, Any] | None = None, page_size: int = 100,
                          ) -> AsyncIterator[list[Document]]:
        self.queries.append(Query(dict(conditions), partition_key, before))
        yield []

    async def create(self, document: Document) -> Document:
        raise AssertionError("a query handler wrote")

    async def read(self, doc_id: str, partition_key: str) -> Document:
        raise AssertionError("a query handler read")

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        raise AssertionError("a query handler wrote")


def app_queries() -> list[Query]:
    """Every query the app makes: the event path's, the operator's, the sweep's and the report's."""
    store = QueryRecorder()

    async def ask() -> None:
        await writes.waiting(store, "intake", "ord-1")
        await operator_commands.find_parked(store, "intake", None)
        await operator_commands.find_parked(store, "intake", "ord-1")
        await OutboxPublisher(store, RecordingSender(), dispatched_ttl_seconds=60, clock=lambda: 1000.0).sweep(
            stuck_after_seconds=60)
        await reports.report_stuck(store, consumer="intake", now=1000.0, parked_after=60, stuck_after=60,
                                   claims_within=("order", "reservationClaim"))
        await migrations.set_due(store)

    asyncio.run(ask())
    return store.queries


def bicep_containers() -> dict[str, dict[str, Any]]:
    """cosmos.bicep's container resources by symbolic name, as pycep parses them."""
    resources = BicepParser().parse(text=COSMOS_BICEP.read_text())["resources"]
    return {name: r["config"] for name, r in resources.items() if r["type"].endswith("/containers")}


def included() -> set[str]:
    return {p["path"] for p in POLICY["includedPaths"]}


def _called(call: ast.Call) -> str | None:
    """The name a call is made by: ``store.query_pages(...)`` or ``query_all(...)``."""
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)


def test_every_store_query_in_the_handlers_is_run_here() -> None:
    found = {}
    for path in [*(ROOT / "shared").rglob("*.py"), *(ROOT / "idempotent_consumer").rglob("*.py")]:
        calls = [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)
                 and _called(node) in ("query_pages", "query_all")]
        if calls and not {"adapters", "ports", "testing"} & set(path.parts):
            found[path.name] = len(calls)
    assert found == QUERY_SITES
    # find_parked is asked twice: across partitions and in one; the report once a kind, and the claims in orders;
    # set_due once a timed kind
    assert len(app_queries()) == 1 + 2 + 1 + 3 + 3


def test_every_field_a_query_filters_on_is_indexed() -> None:
    missing = {f"/{field}/?" for q in app_queries() for field in q.fields()} - included()
    assert not missing, f"queried but not indexed (each would scan the container): {sorted(missing)}"


def test_nothing_else_is_indexed_but_the_partition_key() -> None:
    # The partition key is indexed too: Microsoft's indexing-policy page says an opt-in policy should
    # include it ("the partition key ... is not indexed and should be included"), and every query
    # scoped to one order filters on it. id and _ts are indexed whatever the policy says.
    [partition_key] = bicep_containers()["orders"]["properties"]["resource"]["partitionKey"]["paths"]
    queried = {f"/{field}/?" for q in app_queries() for field in q.fields()}
    assert included() == queried | {f"{partition_key}/?"}


def test_the_policy_is_opt_in_and_consistent() -> None:
    assert POLICY["indexingMode"] == "consistent" and POLICY["automatic"] is True
    assert {p["path"] for p in POLICY["excludedPaths"]} == {"/*", '/"_etag"/?'}
    assert all(p["path"].endswith("/?") for p in POLICY["includedPaths"])  # scalars only, no subtree


def test_no_query_sorts_or_needs_a_composite_index() -> None:
    # ORDER BY on a path the policy excludes is refused (400, "The index path corresponding to the
    # specified order-by item is excluded"); a filter on one only scans. The adapter sorts nothing.
    for q in app_queries():
        sql, _ = query_text(q.conditions, q.before)
        assert "ORDER BY" not in sql.upper(), sql


def test_the_orders_container_loads_the_lean_policy_or_the_migrating_one_and_the_leases_keeps_the_default() -> None:
    parsed: dict[str, Any] = dict(BicepParser().parse(text=COSMOS_BICEP.read_text()))
    loaded = {name: (COSMOS_BICEP.parent / str(v["value"]["function"]["parameters"]["file_path"])).resolve()
              for name, v in parsed["variables"].items() if name.endswith("Policy")}
    assert loaded == {"leanPolicy": POLICY_FILE, "migratingPolicy": MIGRATING_FILE}
    chosen = bicep_containers()["orders"]["properties"]["resource"]["indexingPolicy"]
    assert "ordersIndexing == 'migrating' ? migratingPolicy : leanPolicy" in COSMOS_BICEP.read_text(), chosen
    assert parsed["parameters"]["ordersIndexing"]["default"] == "lean"
    assert "indexingPolicy" not in bicep_containers()["leases"]["properties"]["resource"]


def test_the_migrating_policy_is_the_lean_one_and_what_the_release_before_queried() -> None:
    migrating = json.loads(MIGRATING_FILE.read_text())
    assert {k: v for k, v in migrating.items() if k != "includedPaths"} == {
        k: v for k, v in POLICY.items() if k != "includedPaths"}
    assert {p["path"] for p in migrating["includedPaths"]} == included() | BEFORE_LEAN
    assert not BEFORE_LEAN & included()


def test_the_local_setup_applies_the_same_file() -> None:
    assert cosmos_setup.ORDERS_INDEXING_POLICY.resolve() == POLICY_FILE
    specs = {spec.partition_key_path: spec for spec in cosmos_setup.container_specs()}
    assert specs["/orderId"].indexing_policy == POLICY
    assert specs["/id"].indexing_policy is None


@pytest.fixture
def policy_container(cosmos_endpoint: CosmosEndpoint, capsys: pytest.CaptureFixture[str]) -> Iterator[str]:
    """A database made by the setup script, as make run, the demo and the emulator's steps make it."""
    database = f"policy-{uuid.uuid4().hex[:8]}"
    argv = ["--endpoint", cosmos_endpoint.url, "--key", cosmos_endpoint.key, "--database", database]
    assert cosmos_setup.main(argv + ([] if cosmos_endpoint.verify_tls else ["--no-verify-tls"])) == 0
    yield database
    make_cosmos_client(cosmos_endpoint).delete_database(database)


@pytest.mark.cosmos
def test_the_server_accepts_the_policy_and_keeps_it(
    cosmos_endpoint: CosmosEndpoint, policy_container: str, capsys: pytest.CaptureFixture[str]
) -> None:
    kept = make_cosmos_client(cosmos_endpoint).get_database_client(policy_container).get_container_client(
        "orders").read()["indexingPolicy"]
    if cosmos_endpoint.local:  # the local server stores the policy as given (and uses none)
        assert {p["path"] for p in kept["includedPaths"]} == included()
        assert "note:" not in capsys.readouterr().out


def _matching(query: Query, doc_id: str, order_id: str, *, below: bool) -> Document:
    """A document every condition of ``query`` holds for, its ``before`` field just below (or above) the bound."""
    document: Document = {"id": doc_id, "orderId": order_id, **query.conditions}
    if query.before is not None:
        field, bound = query.before
        document[field] = bound - 1 if below else bound + 1
    return document


@pytest.mark.cosmos
def test_every_app_query_finds_its_documents_on_a_container_with_the_policy(
    cosmos_endpoint: CosmosEndpoint, policy_container: str, loop: asyncio.Runner
) -> None:
    store = CosmosStore.from_settings(Settings(
        cosmos_endpoint=cosmos_endpoint.url, cosmos_key=cosmos_endpoint.key,
        cosmos_verify_tls=cosmos_endpoint.verify_tls, cosmos_database=policy_container, cosmos_container="orders"))
    try:
        for n, query in enumerate(app_queries()):
            order_id = query.partition_key or f"ord-{n}"
            hit = _matching(query, f"hit-{n}", order_id, below=True)
            misses = [_matching(query, f"late-{n}", order_id, below=False)] if query.before else []
            misses.append({**hit, "id": f"other-{n}", "type": "something-else"})
            for document in (hit, *misses):
                loop.run(store.create(document))
            found = loop.run(query_all(store, query.conditions, partition_key=query.partition_key,
                                       before=query.before))
            assert {d["id"] for d in found if d["id"].endswith(f"-{n}")} == {hit["id"]}, query
    finally:
        loop.run(store.close())


def test_the_term_counter_counts_leaves_array_items_and_undefined_included_paths() -> None:
    document = {"id": "a", "orderId": "o", "type": "order", "_etag": '"1"', "_ts": 5,
                "items": [{"sku": "x", "quantity": 1}, {"sku": "y", "quantity": 2}], "payload": {"total": "1.00"}}
    default, orders = index_terms.Policy.of(index_terms.DEFAULT_POLICY), index_terms.Policy.of(POLICY)
    assert len(index_terms.terms(document, default)) == 9  # id, orderId, type, 4 item leaves, payload.total, _ts
    # id and _ts always; orderId and type defined; due, the other included path, undefined; no item or payload
    assert len(index_terms.terms(document, orders)) == 2 + 2 + 1
    assert not orders.indexes("/items/[]/sku/?") and default.indexes("/items/[]/sku/?")
    assert not default.indexes('/"_etag"/?') and orders.indexes("/id/?")
    patched = {**document, "status": "paid", "due": 6.0, "_ts": 6}
    assert index_terms.changed_terms(document, patched, orders) == 2  # due (was undefined) and _ts, not status


def test_a_delete_is_priced_by_the_terms_it_removes_and_a_missing_one_by_nothing() -> None:
    store = index_terms.RecordingStore()
    store.step = "a delete"
    document = {"id": "o", "orderId": "o", "type": "order", "status": "placed", "items": [{"sku": "x"}]}
    written = asyncio.run(store.create(document))
    asyncio.run(store.execute_batch("o", [Delete("o", if_match=written["_etag"])]))
    with pytest.raises(BatchFailed):  # refused (404), nothing written: nothing to price
        asyncio.run(store.execute_batch("o", [Delete("o")]))
    create, delete = store.writes
    assert (delete.operation, delete.kind, delete.after) == ("delete", "order", None)
    default = index_terms.Policy.of(index_terms.DEFAULT_POLICY)
    # id, orderId, type, status, items/0/sku and _ts: 5 RU and 0.2 for each term removed, as a create wrote them
    assert delete.terms(default) == create.terms(default) == 6
    assert delete.ru(default) == pytest.approx(5.0 + 0.2 * 6)


def test_every_path_is_priced_with_its_reads_refusals_feed_and_expiries() -> None:
    figures = index_terms.estimate()
    paths = figures["per path"]
    assert set(paths) == {"new order", "captured payment", "shipment", "copy of a finished order", "duplicate event",
                          "new order, refused", "early event, parked", "event in turn, releasing the parked one",
                          "event before its order, parked", "order after its event, releasing it",
                          "outbox sweep, per run", "stuck report, per run",
                          *(f"{step}{index_terms.IN_ORDER}" for step in
                            ("new order", "captured payment", "shipment", "copy of a finished order"))}
    new, event, copy = paths["new order"], paths["captured payment"], paths["copy of a finished order"]
    # Two patches: the claim's finish (8 properties, its due among them) and the order's reservation (1), 0.4 RU each.
    assert new["patch base"] == pytest.approx(0.4 * 9)
    # The feed reads what the five writes left (the outbox entry's delete shows no change); nothing expires.
    assert (new["feed reads"], new["ttl deletes"]) == (5.0, 0.0)
    # The identity and the inbox marker expire: a delete of each on serverless.
    assert event["ttl deletes"] == pytest.approx(2 * 6.0) and event["serverless"] > event["provisioned"]
    # A copy writes nothing: its batch refused whole (409), the claim read.
    assert (copy["orders"], copy["reads"]) == (0.0, 1.0) and "(409)" in copy["refused"]
    assert paths["early event, parked"]["refused"].endswith("(412)")
    assert paths["outbox sweep, per run"]["query pages"] == 1
    per_order = figures["per order"]
    assert per_order["orders"] == pytest.approx(new["orders"] + index_terms.EVENTS_PER_ORDER
                                                * (event["orders"] + paths["shipment"]["orders"]) / 2, abs=0.1)
    # The claim in the order: the order's create holds it, one patch of the order finishes it (the claim's status,
    # responseStatus, reference, finishedAt, announced and rev, the order's due and reservation: 8), and a copy
    # reads the order alone.
    kept = paths[f"new order{index_terms.IN_ORDER}"]
    kept_copy = paths[f"copy of a finished order{index_terms.IN_ORDER}"]
    assert kept["patch base"] == pytest.approx(0.4 * 8) and kept["orders"] < new["orders"] - 10
    assert kept["feed reads"] == pytest.approx(3.1)  # the order as created and as patched (past 1 KB), the entry
    assert (kept_copy["orders"], kept_copy["reads"]) == (0.0, 1.0) and "create order (409)" in kept_copy["refused"]
    assert figures["per order, claim in the order"]["orders"] < per_order["orders"]


def test_the_performance_docs_quote_the_estimator() -> None:
    section = PERFORMANCE.read_text().split("\n## Indexing policy: write RU, estimated\n", 1)[1].split("\n## ", 1)[0]
    assert index_terms.markdown(index_terms.estimate()) in section, "run python -m bench.index_terms and paste it"
    assert "estimates" in section and "flat 1" in section


def test_a_candidate_policy_is_priced_in_the_orders_policys_place(tmp_path: Path) -> None:
    # One included path: three terms a document (it, id and _ts), so each create is 5.6 RU, not the shipped 6.8.
    candidate = tmp_path / "lean.json"
    candidate.write_text(json.dumps({**POLICY, "includedPaths": [{"path": "/due/?"}]}))
    shipped, lean = index_terms.estimate(), index_terms.estimate(candidate)
    assert {r["RU orders"] for r in lean["writes"] if r["write"] == "create inbox"} == {5.6}
    assert lean["per path"]["new order"]["orders"] < shipped["per path"]["new order"]["orders"]
    assert lean["per path"]["new order"]["default"] == shipped["per path"]["new order"]["default"]


def test_a_candidate_that_is_no_policy_is_one_line_and_exit_status_2(tmp_path: Path) -> None:
    (tmp_path / "not.json").write_text('{"includedPaths": []}')
    for path in (tmp_path / "absent.json", tmp_path / "not.json"):
        run = subprocess.run([sys.executable, "-m", "bench.index_terms", "--policy", str(path)],
                             capture_output=True, text=True, cwd=ROOT, check=False)
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
        assert run.stderr.count("\n") == 1 and f"--policy {path}" in run.stderr
