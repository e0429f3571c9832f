"""The alerts (infra/modules/alerts.bicep): made only with an action group, each on the right scope and
routed to it; and each log query matches the records the app itself writes, and nothing else."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import ServiceRequestError

from idempotent_consumer.adapters.bearer import BearerToken
from idempotent_consumer.breaker import Breaker
from idempotent_consumer.delivery import run_delivery
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.ports.watched import Reach
from idempotent_consumer.reports import report_stuck
from idempotent_consumer.side_effects import SideEffect
from idempotent_consumer.telemetry import record_delivery
from idempotent_consumer.testing.memory import InMemoryStore
from shared.adapters.memory import InMemoryFulfilment
from shared.domain.lifecycle import ORDER_SHIPPED
from shared.handlers.apply_event import apply_order_event
from shared.handlers.place_order import OrderServices, place_order
from shared.ports.fulfilment import Reply
from shared.ports.watched import FULFILMENT
from shared.settings import Settings
from tests.infra.bicep import Scope, Unresolved, expand, main_scope
from tests.support.events import encode_event, event_body
from tests.support.orders import inbound, order_body

ROOT = Path(__file__).resolve().parents[2]
ACTION_GROUP = "/subscriptions/s/resourceGroups/ops/providers/Microsoft.Insights/actionGroups/on-call"
QUEUES = ["orders", "order-events", "order-accepted", "order-rejected"]
# Application Insights' severityLevel of a Python log record.
SEVERITY = {logging.DEBUG: 0, logging.INFO: 1, logging.WARNING: 2, logging.ERROR: 3, logging.CRITICAL: 4}


@pytest.fixture(scope="module")
def alerts() -> Scope:
    return main_scope(actionGroupId=ACTION_GROUP).module("alerts")


def copies(scope: Scope, name: str) -> list[dict]:
    return expand(scope, scope.resources()[name])


def test_no_alert_rule_is_made_without_an_action_group() -> None:
    assert main_scope().params["actionGroupId"] == ""
    assert main_scope().deploys_module("alerts") is False
    assert main_scope(actionGroupId=ACTION_GROUP).deploys_module("alerts") is True


def test_the_alerts_watch_this_deployment_s_namespace_and_application_insights(alerts: Scope) -> None:
    found = alerts.resources()
    assert found["namespace"]["existing"] and found["applicationInsights"]["existing"]
    assert found["namespace"]["config"]["name"] == Unresolved("serviceBus.outputs.name")
    assert found["applicationInsights"]["config"]["name"] == Unresolved("monitoring.outputs.applicationInsightsName")
    assert alerts.params["queueNames"] == QUEUES


def test_a_dead_letter_alert_per_queue_on_its_entity_name(alerts: Scope) -> None:
    rules = copies(alerts, "deadLetterAlerts")
    assert [rule["name"] for rule in rules] == [f"alert-<resourceToken>-deadletters-{queue}" for queue in QUEUES]
    for queue, rule in zip(QUEUES, rules, strict=True):
        properties = rule["properties"]
        assert properties["scopes"] == [Unresolved("namespace.id")]
        [criterion] = properties["criteria"]["allOf"]
        assert (criterion["metricNamespace"], criterion["metricName"]) == (
            "Microsoft.ServiceBus/namespaces", "DeadletteredMessages")
        assert criterion["dimensions"] == [{"name": "EntityName", "operator": "Include", "values": [queue]}]
        assert (criterion["operator"], criterion["threshold"]) == ("GreaterThan", 0)
        assert properties["actions"] == [{"actionGroupId": ACTION_GROUP}]
        assert properties["enabled"] is True


def test_five_log_alerts_on_application_insights_routed_to_the_action_group(alerts: Scope) -> None:
    rules = copies(alerts, "logAlertRules")
    assert [rule["name"] for rule in rules] == [
        "alert-<resourceToken>-parked", "alert-<resourceToken>-side-effects", "alert-<resourceToken>-breaker",
        "alert-<resourceToken>-identity", "alert-<resourceToken>-settlements"]
    for rule in rules:
        properties = rule["properties"]
        assert rule["kind"] == "LogAlert"
        assert properties["scopes"] == [Unresolved("applicationInsights.id")]
        [criterion] = properties["criteria"]["allOf"]
        assert (criterion["timeAggregation"], criterion["operator"], criterion["threshold"]) == (
            "Count", "GreaterThan", 0)
        assert properties["actions"] == {"actionGroups": [ACTION_GROUP]}
        assert properties["enabled"] is True


# The queries against the records the app writes. A tiny reading of KQL: `traces`, then `where` clauses
# of `and`-joined `message startswith/contains "..."` and `severityLevel >= N`, then a `project`.

_PREDICATE = re.compile(r'message (startswith|contains) "([^"]*)"|severityLevel >= (\d)')


def matches(query: str, record: logging.LogRecord) -> bool:
    """Whether the query's ``where`` clauses hold for the record as Application Insights stores it."""
    lines = [line.strip() for line in query.strip().splitlines()]
    assert lines[0] == "traces" and lines[-1].startswith("| project "), query
    message = record.getMessage().lower()
    for line in lines[1:-1]:
        assert line.startswith("| where "), line
        for clause in line.removeprefix("| where ").split(" and "):
            found = _PREDICATE.fullmatch(clause)
            assert found, f"the test cannot read {clause!r}"
            kind, text, level = found.groups()
            if level is not None:
                holds = SEVERITY[record.levelno] >= int(level)
            else:  # KQL's startswith and contains ignore case
                holds = message.startswith(text.lower()) if kind == "startswith" else text.lower() in message
            if not holds:
                return False
    return True


def queries(alerts: Scope) -> dict[str, str]:
    return {rule["name"].removeprefix("alert-<resourceToken>-"): rule["properties"]["criteria"]["allOf"][0]["query"]
            for rule in copies(alerts, "logAlertRules")}


class Refusing(InMemoryFulfilment):
    """A fulfilment service that does not allow the app's identity."""

    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        return Reply(403, {"reason": "the caller lacks the role"})


class Tokenless(InMemoryFulfilment):
    """A fulfilment client whose identity endpoint fails: no token to call with."""

    class Down:
        async def get_token(self, *_: str) -> Any:
            raise ServiceRequestError("identity endpoint unreachable")

        async def close(self) -> None:
            return None

    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        await BearerToken("api://fulfilment/.default", credential=Tokenless.Down).header()
        raise AssertionError("a token from a failing endpoint")


def not_allowed_deliveries(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The delivery records of an order placed against a service refusing the app's identity, and against one the
    app has no token for."""
    records = []
    for service in (Refusing(), Tokenless()):
        store = InMemoryStore()
        message = inbound(order_body("ord-refused"))
        result = asyncio.run(place_order(message, OrderServices(store, service, Settings())))
        assert result.outcome is Outcome.TRANSIENT, result
        caplog.clear()
        record_delivery("process_order", message, result, 1.0)
        records += [r for r in caplog.records if r.getMessage().startswith("delivery ")]
    return records


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def app_records(caplog: pytest.LogCaptureFixture) -> dict[str, list[logging.LogRecord]]:
    """What the app logs for an event parked too long, a side effect stuck, a failed settlement, and an
    ordinary delivery."""
    clock = Clock()
    store = InMemoryStore(default_ttl=-1, clock=clock)
    body = event_body("ord-parked", 3, ORDER_SHIPPED)
    parked = InboundMessage(message_id=body["id"], body=encode_event(body), session_id="ord-parked")
    asyncio.run(apply_order_event(parked, store, Settings(), clock))
    effect = SideEffect(store, "order-projection", "reserve-stock", 60, clock)
    claimant = InboundMessage(message_id="m", body=None, sequence_number=1)
    asyncio.run(store.create(effect.claim("ord-stuck", claimant).to_document()))
    clock.now += 1000
    records: dict[str, list[logging.LogRecord]] = {}
    with caplog.at_level(logging.INFO):
        asyncio.run(report_stuck(store, consumer="order-projection", now=clock.now, parked_after=900, stuck_after=300))
        records["overdue"] = list(caplog.records)
        caplog.clear()

        class LostLock:
            async def settle(self, *_: object) -> None:
                raise RuntimeError("lock lost")

            async def renew_session_lock(self) -> None:
                return None

        async def created(message: InboundMessage) -> Result:
            return Result(Outcome.CREATED, "")

        with pytest.raises(RuntimeError):
            asyncio.run(run_delivery("process_order", lambda: InboundMessage(message_id="m-9", body=b"{}"), created,
                                     LostLock()))
        records["settlement"] = [r for r in caplog.records if r.levelno >= logging.ERROR]
        records["delivery"] = [r for r in caplog.records if r.getMessage().startswith("delivery ")]
        caplog.clear()
        breaker = Breaker("process_order", window=2, open_seconds=30)
        breaker.record(True, clock.now)
        breaker.record(False, clock.now + 30, probe=True, reach=Reach(answered={FULFILMENT}))  # reached it: up
        records["breaker"] = list(caplog.records)
        records["identity"] = not_allowed_deliveries(caplog)
    return records


def test_each_log_query_matches_the_app_s_own_record_and_no_other(alerts: Scope,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    records = app_records(caplog)
    overdue = {r.getMessage().split(" ", 2)[1]: r for r in records["overdue"]}
    [settlement] = records["settlement"]
    [delivery] = records["delivery"]
    opened, closed = records["breaker"]
    refused, tokenless = records["identity"]
    every = {"parked": overdue["parked"], "side-effects": overdue["side-effect"], "settlements": settlement,
             "delivery": delivery, "breaker": opened, "breaker closed": closed, "identity": refused,
             "identity, no token": tokenless}
    for name, query in queries(alerts).items():
        wanted = [name, "identity, no token"] if name == "identity" else [name]
        assert [kind for kind, record in every.items() if matches(query, record)] == wanted, name


def test_docs_show_each_query_as_deployed(alerts: Scope) -> None:
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    for name, query in queries(alerts).items():
        assert f"```kusto\n{query}```" in deploy, name
