"""The chaos run's table: the demo's outside-in invariants, plus the faults injected and what they cost.

Kept as ``chaos.json`` and ``chaos.md`` in the results folder.
"""

from __future__ import annotations

import json
import re
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.versions import Upgrade
from demo import report as demo_report
from demo.probe import LatencyProbe
from demo.scenario import NEVER_APPLIES, Scenario
from idempotent_consumer.outcomes import IDENTITY_MARK

_PARKED = re.compile(r"delivery process_order_event messageId=(\S+) outcome=parked")
_HOST_FAILED = re.compile(r"devservers\.host process_\w+ messageId=\S+ outcome=Failed")


@dataclass
class Run:
    """What the driver knows beyond what it observed: the options, the faults, the replay command."""

    seed: int
    hosts: int
    hosts_started: int
    faults: dict[str, int]
    replay: str
    planted: str | None = None
    failure: str | None = None  # the chaos itself went wrong (the killer stopped early)
    probe: LatencyProbe | None = None  # the local Cosmos server's latency over the run
    upgrade: Upgrade | None = None  # what the check of the two versions' writes found (None: no upgrade)
    upgraded: int = 0  # slots moved to the next version
    drained: str | None = None  # why the drain did not end, if it did not
    fulfilment: dict[str, Any] | None = None  # the stand-in's behaviour and what it answered
    outages: list[dict[str, Any]] | None = None  # the outage phase: each dependency down, and what it received
    rollback: dict[str, Any] | None = None  # the host on the release before, and the copies mapped back
    # The Cosmos DB outages, which explain an outcome resent past the detection window after its delete met one.
    cosmos_outages: demo_report.Outages = field(default_factory=demo_report.Outages)


# What a run says when it ended before its first kill: not a fault of the app, a gap in the proof.
NO_KILL = "no process was killed: the run proves nothing about crashes"


def build(scenario: Scenario, seen: demo_report.Observed, run: Run) -> demo_report.Report:
    """The demo's figures and invariants, then the chaos figures, and one more invariant: no outcome
    ``error`` (an exception the handlers did not expect, which the README calls a bug)."""
    result = demo_report.build(scenario, seen, run.cosmos_outages)
    outcomes: dict[str, int] = result.figures["outcomes"]
    by_kind = Counter({k: v for k, v in run.faults.items() if not k.startswith("kill missed")})
    result.figures.update({
        "seed": run.seed, "hosts": run.hosts, "hosts started": run.hosts_started, "planted bug": run.planted,
        "faults": run.faults, "faults injected": sum(by_kind.values()),
        "invocations failed (lock lost, worker killed)": len(_HOST_FAILED.findall(seen.logs)),
        # Each event parked at least once; the invariants (every event applied, none left parked) say
        # that each was released.
        "parked events released": len(set(_PARKED.findall(seen.logs))),
        "storm": _storm(scenario, seen, result.figures["dead letters"]),
        "replay": run.replay,
    })
    if run.fulfilment is not None:
        result.figures["fulfilment service"] = run.fulfilment
        result.violations += _fulfilment_violations(run.fulfilment)
    if run.outages is not None:
        result.figures["outages"] = run.outages
        result.figures["handed on"] = outcomes.get("handed_on", 0)
        result.figures["handed on untried (breaker open)"] = seen.logs.count("not tried: the ")
        result.figures["breakers opened"] = seen.logs.count("breaker open function=")
        # The app's own account of the identity's outages: deliveries the service refused it in (401, 403), and
        # deliveries that had no token to call with (the identity endpoint failing).
        result.figures["deliveries refused the identity"] = seen.logs.count(f"{IDENTITY_MARK} not allowed")
        result.figures["deliveries without a token"] = seen.logs.count(f"{IDENTITY_MARK} no token for ")
    if run.rollback is not None:
        result.figures["rollback"] = run.rollback
        # The broker numbered sbctl's resubmissions too: they are sent, not duplicates it absorbed. Each one sent
        # counts, those whose dead letter the pass then failed to remove (and sent again later) included.
        result.figures["duplicates absorbed by the broker"] += sum(run.rollback["resubmissions sbctl sent"].values())
        if not run.rollback["hosts rolled back to the release before"]:
            result.violations.append("the rollback moved no host to the release before")
    if run.probe is not None:
        result.figures["local Cosmos server latency"] = run.probe.figures()
        result.violations += run.probe.violations()
    if run.upgrade is not None:
        result.figures["rolling upgrade"] = {"slots upgraded": run.upgraded, **run.upgrade.figures}
        result.violations += run.upgrade.violations
        if run.upgraded < run.hosts:
            result.violations.append(f"the rolling upgrade moved {run.upgraded} of {run.hosts} hosts")
    if run.drained:
        result.violations.append(run.drained)
    if run.failure:
        result.violations.append(run.failure)
    if not any(k.startswith(("kill host", "kill worker")) for k in run.faults):
        result.violations.append(NO_KILL)
    if outcomes.get("error"):
        result.violations.append(f"{outcomes['error']} deliveries ended with outcome error (an unexpected exception)")
    return result


def _fulfilment_violations(service: dict[str, Any]) -> list[str]:
    """What the stand-in's answers say went wrong: calls without the app's token; keys used after it forgot them."""
    found = []
    if service.get("answered 401, no valid token"):
        found.append(f"{service['answered 401, no valid token']} fulfilment calls carried no valid token of the app's"
                     " managed identity")
    if service["keys forgotten, then asked for again"]:
        found.append(f"{service['keys forgotten, then asked for again']} reservation keys were used again after the"
                     " service forgot them")
    return found


def _storm(scenario: Scenario, seen: demo_report.Observed, dead_letters: dict[str, int]) -> dict[str, int]:
    """The storm phase: its orders held back, the events sent for them, those that could never apply, and how
    those ended."""
    held = {planned.message_id for planned in scenario.held}
    rejected = sum(1 for d in seen.documents if d.get("type") == "parked-event" and d.get("status") == "rejected"
                   and d.get("orderId") in held)
    return {"orders held back": len(held),
            "events sent for them": sum(1 for p in scenario.events if p.session_id in held),
            "events past the last version": scenario.count(NEVER_APPLIES),
            "of which rejected on release": rejected,
            "of which dead-lettered InvalidTransition": dead_letters.get("InvalidTransition", 0)}


def unobserved(run: Run, phase: str, error: BaseException) -> demo_report.Report:
    """The verdict of a run whose stack could not be observed: what could not be checked, and why."""
    first_line = (str(error).strip().splitlines() or [""])[0][:300]
    result = demo_report.Report(figures={
        "observed": False, "seed": run.seed, "hosts": run.hosts, "hosts started": run.hosts_started,
        "planted bug": run.planted, "faults": run.faults, "replay": run.replay,
        **({"local Cosmos server latency": run.probe.figures()} if run.probe is not None else {})})
    result.violations.append(f"could not observe the stack during {phase} ({type(error).__name__}: {first_line});"
                             " the invariants were not checked")
    result.figures["error"] = "".join(traceback.format_exception(error))[-4000:]  # for whoever digs, in the JSON
    if run.probe is not None:
        result.violations += run.probe.violations()
    return result


def table(result: demo_report.Report) -> str:
    """The table as Markdown."""
    f = result.figures
    if f.get("observed") is False:
        return _markdown([("verdict", "**not checked**: the stack could not be observed"), ("seed", str(f["seed"])),
                          ("replay", f"`{f['replay']}`"), *_latency_rows(f)])
    rows = [
        ("messages sent / deliveries", f"{f['messages sent']} / {f['deliveries']}"),
        ("competing hosts (started in all)", f"{f['hosts']} ({f['hosts started']})"),
        ("orders sent / written", f"{f['orders']} / {f['orders written']}"),
        ("faults injected", str(f["faults injected"])),
        *[(f"&nbsp;&nbsp;{kind}", str(n)) for kind, n in f["faults"].items()],
        ("invocations failed (lock lost, worker killed)", str(f["invocations failed (lock lost, worker killed)"])),
        ("duplicates absorbed by the broker", str(f["duplicates absorbed by the broker"])),
        ("duplicates absorbed by the consumer", str(f["duplicates absorbed by the consumer"])),
        *[(f"dead letters {reason}", f"{count} (planned {f['dead letters planned'].get(reason, 0)})")
          for reason, count in sorted({**f["dead letters planned"], **f["dead letters"]}.items())],
        ("events parked, then released", str(f["parked events released"])),
        *_storm_rows(f),
        ("reservations / OrderAccepted / OrderRejected (out of stock)",
         f"{f['reservations']} / {f['OrderAccepted']} / {f['OrderRejected']} ({f['orders out of stock']})"),
        *_fulfilment_rows(f),
        *_outage_rows(f),
        *_upgrade_rows(f),
        ("invariant violations", str(len(result.violations))),
        ("elapsed", f"{f['seconds']} s"),
    ]
    return _markdown([*rows, *_latency_rows(f)])


def _storm_rows(f: dict[str, Any]) -> list[tuple[str, str]]:
    storm = f.get("storm") or {}
    if not storm.get("orders held back"):
        return []
    return [("storm: orders held back / events sent for them", f"{storm['orders held back']} /"
                                                                f" {storm['events sent for them']}"),
            ("storm: past the last version / rejected / InvalidTransition",
             f"{storm['events past the last version']} / {storm['of which rejected on release']}"
             f" / {storm['of which dead-lettered InvalidTransition']}")]


def _markdown(rows: list[tuple[str, str]]) -> str:
    width = max(len(label) for label, _ in rows)
    lines = [f"| {'':{width}} | result |", f"| {'-' * width} | ------ |"]
    lines += [f"| {label:{width}} | {value} |" for label, value in rows]
    return "\n".join(lines)


def write(result: demo_report.Report, results: Path) -> None:
    """chaos.json (every figure and violation) and chaos.md (the table, then the violations)."""
    results.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {**result.figures, "violations": result.violations}
    (results / "chaos.json").write_text(json.dumps(figures, indent=2))
    violations = "".join(f"- {v}\n" for v in result.violations)
    (results / "chaos.md").write_text(f"{table(result)}\n\n{violations}")


def _fulfilment_rows(f: dict[str, Any]) -> list[tuple[str, str]]:
    service = f.get("fulfilment service")
    if not service:
        return []
    return [("fulfilment service", service["behaviour"]),
            ("&nbsp;&nbsp;calls / answered 409, key in flight / keys forgotten, then asked again",
             f"{service['calls']} / {service['answered 409, key in flight']} /"
             f" {service['keys forgotten, then asked for again']}"),
            ("&nbsp;&nbsp;calls without a valid token of the app's identity / tokens the identity endpoint issued",
             f"{service['answered 401, no valid token']} / {service['tokens issued by the identity endpoint']}")]


def _outage_rows(f: dict[str, Any]) -> list[tuple[str, str]]:
    outages = f.get("outages")
    if not outages:
        return [("outage phase", "off")]
    return [*[(f"outage: {o['dependency']} answering {o['answered']} / requests it received meanwhile",
               f"{o['seconds']} s / {o['requests received while down']}") for o in outages],
            ("&nbsp;&nbsp;deliveries refused the app's identity / deliveries without a token",
             f"{f['deliveries refused the identity']} / {f['deliveries without a token']}"),
            ("&nbsp;&nbsp;handed on for a delayed retry (untried, breaker open) / breakers opened",
             f"{f['handed on']} ({f['handed on untried (breaker open)']}) / {f['breakers opened']}"),
            ("&nbsp;&nbsp;outcomes resent past the detection window after a Cosmos DB outage (the design's limit)",
             str(f["outcomes resent past the window after a Cosmos DB outage"]))]


def _upgrade_rows(f: dict[str, Any]) -> list[tuple[str, str]]:
    upgrade = f.get("rolling upgrade")
    if upgrade is None:
        return [("rolling upgrade", "off")]
    rollback = f.get("rollback")
    back = [] if rollback is None else [
        ("rollback: hosts on the release before / the copies it dead-lettered, mapped back by sbctl",
         f"{rollback['hosts rolled back to the release before']} /"
         f" {sum(rollback['copies it dead-lettered, mapped back by sbctl'].values())}"),
        ("&nbsp;&nbsp;then `sbctl index backfill` (due on what it wrote without)",
         ", ".join(f"{k} {v}" for k, v in sorted(rollback.get("due set by sbctl index backfill after it", {}).items()))
         or "nothing to set")]
    return [("rolling upgrade: hosts moved to the next version", str(upgrade["slots upgraded"])),
            *[(f"&nbsp;&nbsp;{label}", str(value)) for label, value in upgrade.items() if label != "slots upgraded"],
            *back]


def _latency_rows(f: dict[str, Any]) -> list[tuple[str, str]]:
    latency = f.get("local Cosmos server latency")
    if not latency:
        return []
    rows = [(f"local Cosmos server, {what.removesuffix(' ms')} p50 / p99 / max",
             f"{latency[what]['p50']} / {latency[what]['p99']} / {latency[what]['max']} ms")
            for what in ("point read ms", "partition query ms")]
    probes = f"{latency['probes']} ({latency['failed']}, {latency['stalled']})"
    return [*rows, ("latency probes (failed, stalled)", probes)]
