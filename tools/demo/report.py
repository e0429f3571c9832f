"""What the demo measured, read from outside: the hosts' logs, Cosmos DB, the queues, the fulfilment stand-in.

The invariants are the simulator's, measured on the real stack: one order document per valid order
holding the first content, one reservation and one OrderAccepted per order (none announced for one cancelled before
its reservation finished), every event applied once
and in order, every message applied, absorbed or dead-lettered as planned, nothing left in flight.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from demo.scenario import NEVER_APPLIES, Scenario
from idempotent_consumer import retries
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.side_effects import stored_claims
from sbctl import dlq
from shared.domain.documents import event_records
from shared.domain.lifecycle import KINDS, OPEN_STATUSES, RESERVABLE_STATUSES
from shared.domain.orders import parse_order
from shared.handlers.place_order import RESERVATION_CLAIM
from simulation.invariants import left_undone

ACCEPTED_AS = "_received"  # beside each OrderAccepted body read: its MessageId and when the broker enqueued it
_DELIVERY = re.compile(r"delivery (?P<function>\w+) messageId=(?P<id>\S+) outcome=(?P<outcome>\w+)")
_SETTLED = re.compile(r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) devservers\.host (?P<function>process_\w+) "
                      r"messageId=(?P<id>\S+) outcome=\w+ settlement=(?P<settlement>\w+)", re.MULTILINE)
# For a dead letter's trace: each delivery the app logged (a copy's under its original's MessageId, with its attempt),
# and each invocation the host ran, with its settlement in full: the app's, the host's "(host)", or one that "failed".
_LOGGED = re.compile(r"^(?P<at>\S+ \S+) .*idempotent_consumer: delivery \w+ messageId=(?P<id>\S+)"
                     r" outcome=(?P<outcome>\w+)(?P<rest>.*)$", re.MULTILINE)
_ATTEMPT, _DETAIL = re.compile(r" retryAttempt=(\d+)"), re.compile(r" detail=(.*)$")
_RAN = re.compile(r"^(?P<at>\S+ \S+) devservers\.host process_\w+ messageId=(?P<id>\S+) outcome=(?P<outcome>\w+)"
                  r" settlement=(?P<settlement>.+?) (?P<ms>\d+) ms$", re.MULTILINE)


@dataclass
class Observed:
    """Everything read after the run."""

    documents: list[dict[str, Any]]
    dead_letters: list[Any]
    accepted: list[dict[str, Any]]
    broker_accepted: int
    reservations: list[dict[str, Any]]
    logs: str
    sent_at: dict[str, float]
    elapsed: float
    queues_left: int
    steady: set[str] = field(default_factory=set)  # the steady phase's MessageIds
    steady_per_second: float = 0.0
    rejected: list[dict[str, Any]] = field(default_factory=list)  # the OrderRejected bodies read


@dataclass
class Report:
    """The figures, the invariants, and how to show them."""

    figures: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    timeline: dict[str, list[float]] = field(default_factory=dict)
    outage: tuple[float, float] | None = None  # when the fulfilment service was down, for the chart

    def add_outage(self, logs: str, calls: list[Any], start: float, end: float, drained: float) -> None:
        """The fulfilment outage and the recovery from it: how long, the requests the service received while down,
        the messages handed on and the breakers opened, and when the last order waiting for it was reserved: the
        last reservation between the return and the burst's drain (``drained``), not the steady phase's after it."""
        reserved = [call.time for call in calls if 200 <= call.status < 300 and end <= call.time <= drained]
        self.outage = (start, end)
        self.figures["outage"] = {
            "seconds": round(end - start), "requests received while down": sum(start <= c.time < end for c in calls),
            "handed on": self.figures["outcomes"].get("handed_on", 0),
            "handed on untried (breaker open)": logs.count("not tried: the "),
            "breakers opened": logs.count("breaker open function="),
            "last reservation after the service came back, s": round(max(reserved) - end, 1) if reserved else None,
        }


@dataclass(frozen=True)
class Outages:
    """The Cosmos DB outages of a run (start, end), and the destinations' duplicate-detection window: an outcome
    sent just before an outage whose delete met it is resent after it, past the window, under the same MessageId
    (the design's limit: docs/design.md, "Transactional outbox"), and is counted, not a violation."""

    cosmos: Sequence[tuple[float, float]] = ()
    window: float = 0.0

    def explain(self, first: float, resent: float) -> bool:
        """Whether a copy enqueued at ``first`` and its resend at ``resent`` are one outage's: the first sent at
        most the window before the outage began (its delete follows it at once) or while it lasted, the resend
        after it ended."""
        return any(start - self.window <= first <= end <= resent for start, end in self.cosmos)


def build(scenario: Scenario, seen: Observed, outages: Outages = Outages()) -> Report:
    """Compute the report and check the invariants; ``outages`` explains the resends that a Cosmos DB outage
    between a send and its delete causes."""
    report = Report()
    outcomes = Counter(m["outcome"] for m in _DELIVERY.finditer(seen.logs))
    by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for doc in seen.documents:
        by_type[str(doc.get("type"))].append(doc)
    by_type["side-effect"] = list(stored_claims(seen.documents, RESERVATION_CLAIM))  # of their own, or in the order
    reasons = Counter(str(m.dead_letter_reason) for m in seen.dead_letters)
    planned_reasons = scenario.planned_dead_letters()
    sent = len(scenario.everything())
    latencies = _latencies(seen, steady=True)
    backlog = _latencies(seen, steady=False)
    report.figures = {
        "orders": len(scenario.orders), "messages sent": sent, "deliveries": sum(outcomes.values()),
        "orders written": len(by_type["order"]),
        "events applied": sum(1 for _ in event_records(seen.documents)),
        "events stale": outcomes["stale"], "events parked": outcomes["parked"],
        # The broker numbers the copies the hosts handed on too: one per handed_on delivery, sent by the app.
        "duplicates absorbed by the broker": sent + outcomes["handed_on"] - seen.broker_accepted,
        "duplicates absorbed by the consumer": outcomes["duplicate"] + outcomes["in_progress"],
        "dead letters": dict(reasons), "dead letters planned": dict(planned_reasons),
        "reservations": len(seen.reservations), "OrderAccepted": len(seen.accepted),
        # Outcomes the order's status would contradict (cancelled; shipped before a refusal): recorded, not announced.
        "outcomes unannounced, the order cancelled or shipped": sum(
            1 for d in by_type["side-effect"] if d.get("announces") is False),
        "OrderRejected": len(seen.rejected), "orders out of stock": len(scenario.rejected),
        "outcomes": dict(outcomes), "seconds": round(seen.elapsed, 1),
        "messages per second": round((sent - len(seen.steady)) / seen.elapsed, 1) if seen.elapsed else 0.0,
        "latency p50 ms": _percentile(latencies, 50), "latency p99 ms": _percentile(latencies, 99),
        "steady messages": len(seen.steady), "steady messages per second": round(seen.steady_per_second, 1),
        "backlog latency p50 ms": _percentile(backlog, 50), "backlog latency p99 ms": _percentile(backlog, 99),
        **_drain_rates(seen),
    }
    resent: list[str] = []
    report.violations = _violations(scenario, seen, by_type, reasons, outages=outages, resent=resent)
    report.figures["outcomes resent past the window after a Cosmos DB outage"] = len(resent)
    report.timeline = _timeline(seen)
    return report


def _latencies(seen: Observed, *, steady: bool) -> list[float]:
    """From each message's send to its first settlement: the steady phase's messages, or the others (which
    includes the time they waited in the burst's backlog)."""
    first_settled: dict[str, float] = {}
    for match in _SETTLED.finditer(seen.logs):
        at = datetime.strptime(match["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        first_settled.setdefault(match["id"], at)
    return [(at - seen.sent_at[i]) * 1000 for i, at in first_settled.items()
            if i in seen.sent_at and (i in seen.steady) is steady]


def _drain_rates(seen: Observed) -> dict[str, float]:
    """Messages settled per second on each input queue, from its first settlement to its last (the hosts'
    log), each MessageId counted at its first settlement: the late copies, sent after the detection
    window, would stretch the orders' span."""
    moments = _first_settlements(seen.logs, leave_out=seen.steady)
    rates = {}
    for function, label in (("process_order", "orders"), ("process_order_event", "events")):
        times = list(moments.get(function, {}).values())
        span = max(times) - min(times) if len(times) > 1 else 0.0
        rates[f"{label} drained per second"] = round((len(times) - 1) / span, 1) if span else 0.0
    orders, events = rates["orders drained per second"], rates["events drained per second"]
    rates["events against orders"] = round(events / orders, 2) if orders else 0.0
    return rates


def _first_settlements(logs: str, leave_out: set[str]) -> dict[str, dict[str, float]]:
    """Function -> MessageId -> when its first delivery was settled, from the hosts' log."""
    moments: dict[str, dict[str, float]] = defaultdict(dict)
    for match in _SETTLED.finditer(logs):
        if match["id"] not in leave_out:
            at = datetime.strptime(match["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            moments[match["function"]].setdefault(match["id"], at)
    return moments


def drain_rate(logs: str) -> float:
    """Messages settled per second over both input queues, first settlement to last (each MessageId once)."""
    times = [at for by_id in _first_settlements(logs, set()).values() for at in by_id.values()]
    span = max(times) - min(times) if len(times) > 1 else 0.0
    return (len(times) - 1) / span if span else 0.0


def _percentile(values: list[float], pct: int) -> float:
    if not values:
        return 0.0
    return round(statistics.quantiles(values, n=100)[pct - 1] if len(values) > 1 else values[0], 1)


def _violations(scenario: Scenario, seen: Observed, by_type: dict[str, list[dict[str, Any]]],
                reasons: Counter[str], *, outages: Outages, resent: list[str]) -> list[str]:
    found: list[str] = []
    orders = Counter(d["orderId"] for d in by_type["order"])
    for order_id, body in scenario.orders.items():
        expected = parse_order(InboundMessage(order_id, json.dumps(body).encode())).request_hash()
        docs = [d for d in by_type["order"] if d["orderId"] == order_id]
        if orders[order_id] != 1 or docs[0]["requestHash"] != expected:
            found.append(f"order {order_id}: {orders[order_id]} documents, or not the first content")
            continue
        lifecycle = scenario.lifecycles[order_id]
        final = docs[0]
        if final["version"] != 1 + len(lifecycle) or final["status"] != KINDS[lifecycle[-1]["type"]].status_after:
            found.append(f"order {order_id}: {final['status']} at version {final['version']} after"
                         f" {len(lifecycle)} events")
    found += _outcomes(scenario, seen, by_type, outages, resent)
    # An event applied twice would leave two records of one version: two documents an earlier release wrote, or
    # one of those and its order's sub-object.
    records = Counter((order_id, record["sequence"]) for order_id, record in _records_by_order(seen.documents))
    if any(count != 1 for count in records.values()):
        found.append("an event was recorded more than once")
    reasons = Counter(reasons)
    forbidden, never = reasons.pop("InvalidTransition", 0), scenario.count(NEVER_APPLIES)
    if reasons != scenario.planned_dead_letters() or forbidden > never:
        found.append(f"dead letters {dict(reasons)}, InvalidTransition {forbidden}, differ from the plan"
                     f" {dict(scenario.planned_dead_letters())}, InvalidTransition at most {never} (events past"
                     " their order's last version)" + _traced(seen, reasons - scenario.planned_dead_letters()))
    in_flight = [undone for d in seen.documents if (undone := left_undone(d)) is not None]
    if in_flight or seen.queues_left:
        found.append(f"{len(in_flight)} documents and {seen.queues_left} messages still in flight"
                     + "".join(f"; {undone}" for undone in in_flight[:3]))
    return found


def _outcomes(scenario: Scenario, seen: Observed, by_type: dict[str, list[dict[str, Any]]], outages: Outages,
              resent: list[str]) -> list[str]:
    """Each order announced once, as what happened to its stock: one reservation and one OrderAccepted, or (out of
    stock) no reservation and one OrderRejected; never an OrderAccepted without a reservation, never both. An order
    whose outcome would have contradicted it (cancelled before its reservation finished; shipped before it was
    refused) announces nothing and holds at most one reservation; and then its status must say so indeed.

    A copy of an outcome that ``outages`` explains (its MessageId resent after a Cosmos DB outage that its delete
    met) is not counted against the order: its id goes to ``resent``. Any other second copy is a violation."""
    found = []
    reserved = Counter(r.get("orderId") for r in seen.reservations)
    accepted = _announced(seen.accepted, outages, resent)
    rejected = _announced(seen.rejected, outages, resent)
    records = {d["orderId"]: d for d in by_type["side-effect"]}
    statuses = {d["orderId"]: d.get("status") for d in by_type["order"]}
    refused = scenario.rejected
    for order_id in scenario.orders:
        counts = (reserved[order_id], accepted[order_id], rejected[order_id])
        record = records.get(order_id, {})
        if record.get("announces") is False:  # its outcome would have contradicted the order: not announced
            allowed = OPEN_STATUSES if record.get("status") == "rejected" else RESERVABLE_STATUSES
            if statuses.get(order_id) in allowed or counts[1:] != (0, 0) or counts[0] > 1:
                found.append(f"order {order_id} ({statuses.get(order_id)}), its reservation closed unannounced:"
                             f" {counts[0]} reservations, {counts[1]} OrderAccepted and {counts[2]} OrderRejected")
            continue
        expected = (0, 0, 1) if order_id in refused else (1, 1, 0)
        if counts != expected:
            found.append(f"order {order_id}: {reserved[order_id]} reservations, {accepted[order_id]} OrderAccepted"
                         f" and {rejected[order_id]} OrderRejected messages, not {expected[0]}, {expected[1]} and"
                         f" {expected[2]}{_copies(seen, order_id)}")
        if accepted[order_id] and not reserved[order_id]:
            found.append(f"order {order_id}: OrderAccepted without a reservation")
    return found


def _traced(seen: Observed, unplanned: Counter[str]) -> str:
    """The first few dead letters of a reason the plan has too many of, each with what its deliveries
    logged, in order: the app's outcomes (a copy's under its original's MessageId and its attempt), the last with
    its detail, and each invocation's host outcome and settlement (``abandon`` the app's, ``abandon (host)`` after
    a failed invocation, ``... failed`` with the lock lost), with its time and duration, before the broker gave up."""
    traced = []
    for message in [m for m in seen.dead_letters if str(m.dead_letter_reason) in unplanned][:3]:
        message_id = str(message.message_id)
        chain = retries.chain_of(dlq.text_properties(message))
        key, attempt = (chain.original_message_id, str(chain.attempt)) if chain else (message_id, None)
        logged = sorted((m for m in _LOGGED.finditer(seen.logs) if m["id"] == key
                         and _group(_ATTEMPT, m["rest"]) == attempt), key=lambda m: m["at"])  # the hosts' logs, merged
        outcomes = [m["outcome"] for m in logged]
        last = (_group(_DETAIL, logged[-1]["rest"]) or "")[:160] if logged else ""
        detail = f" (the last at {logged[-1]['at'][11:]}: {last!r})" if logged else ""
        ran = sorted(m.groups() for m in _RAN.finditer(seen.logs) if m["id"] == message_id)
        settled = [f"{at[11:]} {outcome} {settlement} {ms} ms" for at, _, outcome, settlement, ms in ran]
        traced.append(f"; {message_id} {message.dead_letter_reason}: the app logged {outcomes}{detail}, the hosts"
                      f" ran {settled}, described {str(message.dead_letter_error_description)[:200]!r}")
    return "".join(traced)


def _group(pattern: re.Pattern[str], text: str) -> str | None:
    return match[1] if (match := pattern.search(text)) else None


def _announced(outcomes: list[dict[str, Any]], outages: Outages, resent: list[str]) -> Counter[Any]:
    """Outcome messages per order, less the copies ``outages`` explains, whose MessageIds go to ``resent``."""
    copies: dict[Any, list[tuple[str, float | None]]] = defaultdict(list)
    for outcome in outcomes:
        message_id, enqueued = outcome.get(ACCEPTED_AS) or ["?", None]
        copies[outcome.get("orderId")].append((message_id, enqueued))
    counted: Counter[Any] = Counter()
    for order_id, received in copies.items():
        received.sort(key=lambda copy: copy[1] or 0.0)
        first_id, first_at = received[0]
        explained = [(i, at) for i, at in received[1:] if i == first_id and first_at is not None and at is not None
                     and outages.explain(first_at, at)]
        resent += [i for i, _ in explained]
        counted[order_id] = len(received) - len(explained)
    return counted


def _copies(seen: Observed, order_id: str) -> str:
    """For an order with more than one OrderAccepted: under how many MessageIds, and how far apart the
    broker enqueued them (a resend past the destination's detection window keeps its MessageId)."""
    copies = sorted((m.get(ACCEPTED_AS) or ["?", None] for m in seen.accepted if m.get("orderId") == order_id),
                    key=lambda copy: copy[1] or 0.0)
    if len(copies) < 2:
        return ""
    ids = len({message_id for message_id, _ in copies})
    apart = ", ".join(f"{round(b[1] - a[1])} s" for a, b in itertools.pairwise(copies) if a[1] and b[1])
    return f" ({'one MessageId' if ids == 1 else f'{ids} MessageIds'}, enqueued {apart} apart)"


def _timeline(seen: Observed) -> dict[str, list[float]]:
    series: dict[str, list[float]] = defaultdict(list)
    for line in seen.logs.splitlines():
        if (match := _DELIVERY.search(line)) and line[:23].count("-") == 2:
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            series[match["outcome"]].append(at)
    return dict(series)


def table(report: Report) -> str:
    """The report as a table a person reads at a glance."""
    f = report.figures
    rows = [
        ("orders sent / written", f"{f['orders']} / {f['orders written']}"),
        ("events applied / stale / parked first",
         f"{f['events applied']} / {f['events stale']} / {f['events parked']}"),
        ("messages sent / deliveries", f"{f['messages sent']} / {f['deliveries']}"),
        ("duplicates absorbed by the broker", str(f["duplicates absorbed by the broker"])),
        ("duplicates absorbed by the consumer", str(f["duplicates absorbed by the consumer"])),
        *[(f"dead letters {reason}", f"{count} (planned {f['dead letters planned'].get(reason, 0)})")
          for reason, count in sorted({**f["dead letters planned"], **f["dead letters"]}.items())],
        ("reservations at the fulfilment service", str(f["reservations"])),
        ("OrderAccepted at order-accepted", str(f["OrderAccepted"])),
        ("OrderRejected at order-rejected (orders out of stock)", f"{f['OrderRejected']} ({f['orders out of stock']})"),
        ("outcomes not announced: the order cancelled first (or shipped, then refused)",
         str(f["outcomes unannounced, the order cancelled or shipped"])),
        ("time", f"{f['seconds']} s, {f['messages per second']} messages/s"),
        ("drained per second: orders / events", f"{f['orders drained per second']} / {f['events drained per second']}"
                                                 f" ({f['events against orders']}x)"),
        (f"end-to-end latency p50 / p99 at a steady {f['steady messages per second']} messages/s",
         f"{f['latency p50 ms']} ms / {f['latency p99 ms']} ms ({f['steady messages']} messages)")
        if f["steady messages"] else ("end-to-end latency p50 / p99", "not measured: no steady phase"),
        ("send to settlement in the burst's backlog p50 / p99",
         f"{f['backlog latency p50 ms']} ms / {f['backlog latency p99 ms']} ms"),
        *_outage_rows(f),
        ("invariant violations", str(len(report.violations))),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [f"| {'':{width}} | result |", f"| {'-' * width} | ------ |"]
    lines += [f"| {label:{width}} | {value} |" for label, value in rows]
    return "\n".join(lines + [f"- {v}" for v in report.violations[:20]])


def _outage_rows(f: dict[str, Any]) -> list[tuple[str, str]]:
    outage = f.get("outage")
    if not outage:
        return []
    return [("fulfilment down / requests it received meanwhile",
             f"{outage['seconds']} s / {outage['requests received while down']}"),
            ("handed on for a delayed retry (untried, breaker open) / breakers opened",
             f"{outage['handed on']} ({outage['handed on untried (breaker open)']}) / {outage['breakers opened']}"),
            ("recovered: the last reservation after the service came back",
             f"{outage['last reservation after the service came back, s']} s")]


def write(report: Report, results: Path) -> None:
    """The figures as JSON and a PNG chart of outcomes and throughput over time."""
    results.mkdir(parents=True, exist_ok=True)
    (results / "demo.json").write_text(json.dumps({**report.figures, "violations": report.violations}, indent=2))
    import matplotlib  # noqa: PLC0415 - only the demo draws

    matplotlib.use("Agg")
    from matplotlib import pyplot  # noqa: PLC0415

    start = min((t for ts in report.timeline.values() for t in ts), default=0.0)
    figure, (outcomes, throughput) = pyplot.subplots(2, 1, figsize=(10, 7), sharex=True)
    every = sorted(t - start for ts in report.timeline.values() for t in ts)
    for outcome, times in sorted(report.timeline.items()):
        outcomes.plot(sorted(t - start for t in times), range(1, len(times) + 1), label=outcome)
    if report.outage is not None:
        for axes in (outcomes, throughput):
            axes.axvspan(report.outage[0] - start, report.outage[1] - start, color="tab:red", alpha=0.12,
                         label="fulfilment down" if axes is outcomes else None)
    outcomes.set(ylabel="deliveries (cumulative)", title="Outcomes over time")
    outcomes.legend(loc="upper left", fontsize="small")
    seconds = int(every[-1]) + 1 if every else 1
    per_second = Counter(int(t) for t in every)
    throughput.bar(range(seconds), [per_second[s] for s in range(seconds)], width=1.0)
    throughput.set(xlabel="seconds since the first delivery", ylabel="deliveries per second", title="Throughput")
    figure.tight_layout()
    figure.savefig(results / "demo.png", dpi=100)
    pyplot.close(figure)


def _records_by_order(documents: list[dict[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    """Each applied event's record, with its order's id."""
    found = []
    for document in documents:
        for _, record in event_records([document]):
            found.append((str(document["orderId"]), record))
    return found
