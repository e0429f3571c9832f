"""The operator's workbook (infra/modules/workbook.bicep, its panels in infra/workbook/panels.json): deployed with the
app, over its Application Insights and its namespace; and each query, run over the records the app itself writes,
finds what they say: outcomes by function, dead letters by reason, events parked, what waits too long, latency."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from demo import kql
from demo.workbook import traces
from idempotent_consumer.delivery import SETTLEMENTS, Action
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.reports import report_stuck
from idempotent_consumer.side_effects import SideEffect
from idempotent_consumer.telemetry import record_delivery
from idempotent_consumer.testing.memory import InMemoryStore
from shared.domain.lifecycle import ORDER_SHIPPED
from shared.handlers.apply_event import apply_order_event
from shared.settings import Settings
from tests.infra.bicep import INFRA, Unresolved, main_scope
from tests.support.events import encode_event, event_body

PANELS = json.loads((INFRA / "workbook" / "panels.json").read_text())
QUERIES = {panel["name"]: panel["query"] for panel in PANELS["panels"]}
START = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


def rows(records: list[logging.LogRecord]) -> list[dict[str, Any]]:
    """The records as Application Insights keeps them in ``traces``."""
    return [{"timestamp": datetime.fromtimestamp(r.created, UTC), "message": r.getMessage(),
             "severityLevel": {logging.INFO: 1, logging.WARNING: 2, logging.ERROR: 3}.get(r.levelno, 0)}
            for r in records]


def test_the_workbook_is_deployed_with_the_app_over_its_application_insights_and_namespace() -> None:
    main = main_scope()
    assert main.deploys_module("workbook") is True
    workbook = main.module("workbook")
    text = (INFRA / "modules" / "workbook.bicep").read_text()
    assert "loadJsonContent('../workbook/panels.json')" in text
    found = workbook.resources()["dashboard"]["config"]
    assert (found["kind"], found["properties"]["category"]) == ("shared", "workbook")
    assert found["properties"]["sourceId"] == Unresolved("applicationInsights.id")
    metric = workbook.evaluate(workbook.template["variables"]["deadLetterMetric"]["value"])["content"]
    assert metric["resourceIds"] == [Unresolved("namespace.id")]
    assert metric["metrics"] == [{"namespace": "microsoft.servicebus/namespaces", "aggregation": 3,
                                  "metric": "microsoft.servicebus/namespaces--DeadletteredMessages",
                                  "splitBy": "EntityName"}]
    assert {panel["name"] for panel in PANELS["panels"]} == {"outcomes", "dead-letters", "parked", "handed-on",
                                                             "waiting", "latency"}


@pytest.fixture
def deliveries(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """What the app logs for one delivery of each outcome of each function, one minute apart, each enqueued a
    known time before it was settled."""
    with caplog.at_level(logging.INFO):
        for n, (function, outcome) in enumerate((f, o) for f in ("process_order", "process_order_event")
                                                for o in Outcome):
            enqueued = START - timedelta(milliseconds=100 * (n + 1))
            record_delivery(function, InboundMessage(f"m-{n}", b"{}", enqueued_time_utc=enqueued),
                            Result(outcome, "why" if outcome is Outcome.INVALID else ""), 3.0)
    found = rows([r for r in caplog.records if r.getMessage().startswith("delivery ")])
    for n, row in enumerate(found):
        row["timestamp"] = START + timedelta(minutes=n)
    return found


def test_outcomes_are_counted_by_function_and_outcome(deliveries: list[dict[str, Any]]) -> None:
    found = kql.run(QUERIES["outcomes"], deliveries)
    series = {row["series"]: 0 for row in found}
    for row in found:
        series[row["series"]] += row["count_"]
    assert series == {f"{f}: {o.value}": 1 for f in ("process_order", "process_order_event") for o in Outcome}


def test_dead_letters_are_counted_by_function_and_the_reason_the_settlement_gives(
    deliveries: list[dict[str, Any]],
) -> None:
    found = {row["series"]: row["count_"] for row in kql.run(QUERIES["dead-letters"], deliveries)}
    reasons = {s.reason for s in SETTLEMENTS.values() if s.action is Action.DEADLETTER}
    assert found == {f"{f}: {r}": 1 for f in ("process_order", "process_order_event") for r in reasons}


def test_events_parked_are_counted_from_the_deliveries_that_parked_one(deliveries: list[dict[str, Any]]) -> None:
    found = kql.run(QUERIES["parked"], deliveries)
    assert sorted((row["function"], row["count_"]) for row in found) == [("process_order", 1),
                                                                         ("process_order_event", 1)]


def test_messages_handed_on_are_counted_from_the_deliveries_that_handed_one_on(
    deliveries: list[dict[str, Any]],
) -> None:
    found = kql.run(QUERIES["handed-on"], deliveries)
    assert sorted((row["function"], row["count_"]) for row in found) == [("process_order", 1),
                                                                         ("process_order_event", 1)]


def test_latency_is_the_p50_and_p99_of_what_the_records_say(deliveries: list[dict[str, Any]]) -> None:
    found = kql.run(QUERIES["latency"], deliveries)
    assert {row["function"] for row in found} == {"process_order", "process_order_event"}
    assert all(row["p50"] is not None and row["p50"] > 0 for row in found)
    assert all(row["p99"] >= row["p50"] for row in found)


def test_what_waits_too_long_is_counted_by_kind(caplog: pytest.LogCaptureFixture) -> None:
    now = [1_000_000.0]
    store = InMemoryStore(default_ttl=-1, clock=lambda: now[0])
    body = event_body("ord-parked", 3, ORDER_SHIPPED)
    asyncio.run(apply_order_event(InboundMessage(body["id"], encode_event(body), session_id="ord-parked"), store,
                                  Settings(), lambda: now[0]))
    effect = SideEffect(store, "order-projection", "reserve-stock", 60, lambda: now[0])
    asyncio.run(store.create(effect.claim("ord-stuck", InboundMessage("m", None, sequence_number=1)).to_document()))
    now[0] += 1000
    with caplog.at_level(logging.INFO):
        asyncio.run(report_stuck(store, consumer="order-projection", now=now[0], parked_after=900, stuck_after=300))
    found = kql.run(QUERIES["waiting"], rows(caplog.records))
    assert sorted((row["kind"], row["count_"]) for row in found) == [("parked", 1), ("side-effect", 1)]


def test_a_query_outside_the_subset_the_test_reads_is_refused_not_passed() -> None:
    with pytest.raises(kql.Unsupported, match="the verb 'join'"):
        kql.run("traces\n| join (requests) on operation_Id", [])


def test_the_picture_reads_the_app_s_records_from_a_hosts_log_and_refuses_a_log_without_them(tmp_path: Path) -> None:
    log = ("2026-12-03 09:00:01,250 devservers.host.channel worker [1a2b3c4d] idempotent_consumer: delivery"
           " process_order messageId=ord-1 outcome=created latencyMs=812.5 deliveryCount=None durationMs=41.0\n"
           "2026-12-03 09:00:02,000 devservers.host process_order messageId=ord-1 outcome=Succeeded settlement=none\n")
    [row] = traces(log)
    assert row["timestamp"] == datetime(2026, 12, 3, 9, 0, 1, 250000, tzinfo=UTC)
    assert row["message"].startswith("delivery process_order messageId=ord-1 outcome=created latencyMs=812.5")
    [latency] = kql.run(QUERIES["latency"], [row])
    assert (latency["function"], latency["p50"], latency["p99"]) == ("process_order", 812.5, 812.5)
    empty = tmp_path / "hosts.log"
    empty.write_text("nothing of the app's\n")
    done = subprocess.run([sys.executable, "-m", "demo.workbook", "--logs", str(empty), "--out",
                           str(tmp_path / "w.png")], cwd=INFRA.parent, capture_output=True, text=True, check=False)
    assert done.returncode == 1 and done.stderr.startswith("error: ") and "Traceback" not in done.stderr
