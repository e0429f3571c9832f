"""``make chaos``: proof under faults over the real stack.

Starts the local stack (broker, Cosmos server, fulfilment stand-in) and competing local Functions
hosts, each behind its own Cosmos and fulfilment fault proxies (chaos/faults.py); sends the demo's
scenario (orders, producer retries inside and outside the detection window, reused ids, malformed
messages, events out of order within their sessions, and a storm phase: a few orders held back while
their events are rebuilt and resent under new ids, then the orders) while requests fail at random and hosts and
workers are killed, at random moments and at chosen ones, and, in an outage phase, the fulfilment service is down,
then refuses the app's identity (401, 403), then the identity endpoint fails so that no host has a token, then
Cosmos DB is down, for minutes each (the delayed retries carry the messages over); from half-way through the
sending, replaces
the hosts one by one by hosts on a generated next version of the app (a rolling upgrade, while the
old ones still run: chaos/versions.py), and as the fulfilment service comes back rolls one host back to
the release before delayed retries for 45 s (``--rollback``), whose dead-lettered copies sbctl maps back
(chaos/rollback.py);
stops killing once everything is sent,
waits until the queues and the outbox have drained, then checks the invariants from outside: at the
fulfilment service, at order-accepted, in Cosmos DB, in the queues and their dead-letter queues, and
that nothing either version wrote was lost. A probe measures the local Cosmos server's latency all
along. Prints the table and keeps it as chaos.json and chaos.md, with the hosts' logs as hosts.log; exit
1, with the seed and the replay command, when an invariant is broken or when the stack could not be
observed (what could not be checked is said instead of the table).

    python -m chaos [--orders 3500] [--hosts 4] [--seed 1] [--rate 24] [--results results/chaos] [--plant NAME]
                    [--no-upgrade] [--events-queue sessions|plain] [--storm-orders 4] [--storm-copies 120]
                    [--fulfilment standard|ietf] [--fulfilment-outage 180] [--not-allowed 60]
                    [--identity-outage 120] [--cosmos-outage 120] [--rollback 45]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from azure.servicebus import ServiceBusClient

from chaos import planted, report, versions
from chaos.faults import LOCK_SECONDS, Chaos
from chaos.rollback import MapBack, backfill
from demo import observe
from demo import report as demo_report
from demo.probe import LatencyProbe
from demo.scenario import Scenario, plan
from demo.stack import DETECTION_WINDOW_SECONDS, ROOT, Stack
from devservers.faultproxy import OUTAGE
from devservers.identity import Tokens

SECONDS_PER_ORDER = 0.5  # the drain deadline: 5 minutes, plus this per order
UPGRADE_SHARE = 0.4  # of the sending time, from its half-way point, over which the hosts are upgraded
# One host on the release before delayed retries this long by default (``--rollback``), from the fulfilment service's
# return (longer, up to three times, until the operator's map-back has found a copy it dead-lettered): the copies of
# its backlog come due then, and those it receives are dead-lettered InvalidMessage, for the operator to map back.
# The outages after the first wait for it to be forward again.
ROLLBACK_SECONDS = 45.0
LONGEST_ROLLBACK = 180.0  # three times this, and a host's start, stay inside faults.ROLLBACK_WAIT_LIMIT_SECONDS
STORMS, STORM_COPIES = 4, 120  # the storm phase: orders, and copies of each of their events
# The delayed retries on the chaos hosts: the first copy due after 2 s, at most 30 s apart (Azure's defaults are
# 10 s and 15 minutes), so that a run's copies come back within it and are tried more often (with a 6 s lock there
# is no room to try again inside it), and handed on for at most 30 minutes, far past the outages below.
RETRY_SETTINGS = {"RETRY_BACKOFF_SECONDS": "2", "RETRY_BACKOFF_CEILING_SECONDS": "30", "RETRY_TOTAL_SECONDS": "1800"}
# The fulfilment stand-in as a service following the IETF Idempotency-Key draft: a request under a key another
# still holds is answered 409; each new reservation takes up to 6 s while it holds its key (the stack's read
# timeout is 2 s: two calls in three time out while the service still works on them, and a later call meets
# some of them still in flight); and keys are forgotten 3,720 s after their reservation, twice the longest a
# claim stays in progress (the lock x MaxDeliveryCount, 6 s x 10, plus RETRY_TOTAL_SECONDS), so that a call
# made on a key after that would reserve a second time. A service must keep its keys that long: docs/adapt.md.
FULFILMENT_BEHAVIOURS: dict[str, dict[str, Any]] = {
    "standard": {},
    "ietf": {"ietf": True, "processing_seconds": (0.0, 6.0), "forget_keys_after": 3720.0},
}
# Where the hosts write a new order's reservation claim (``--claims``), as the run's first line says it.
CLAIMS = {"both": "inside the order on every other slot, of their own on the rest", "in-order": "inside the order",
          "own": "documents of their own"}
# The outage phase: the fulfilment stand-in refuses everything (503); then, after a pause each, it refuses the app's
# identity (401, then 403), the identity endpoint fails (500), and every host's Cosmos proxy refuses everything;
# from this share of the sending time on, the pause a tenth of it.
OUTAGE_FROM_SHARE, OUTAGE_GAP_SHARE = 0.15, 0.1
# The hosts' tokens live a third of the identity endpoint's outage (at least 10 s; hours in Azure), so that most of
# it passes with every token expired: azure-identity keeps using a token it holds while the endpoint fails, so an
# outage shorter than a token's life would never be seen. Without an identity outage, an hour.
TOKEN_LIFETIME_SHARE, TOKEN_LIFETIME_LEAST = 1 / 3, 10.0


def replay_command(options: Options) -> str:
    """The command that runs the same plan again."""
    return (f"python -m chaos --orders {options.orders} --hosts {options.hosts} --seed {options.seed}"
            f" --rate {options.rate:g}" + (f" --plant {options.plant}" if options.plant else "")
            + ("" if options.upgrade else " --no-upgrade")
            + ("" if options.events_sessions else " --events-queue plain")
            + ("" if options.storms == STORMS else f" --storm-orders {options.storms}")
            + ("" if options.storm_copies == STORM_COPIES else f" --storm-copies {options.storm_copies}")
            + ("" if options.fulfilment == "standard" else f" --fulfilment {options.fulfilment}")
            + ("" if options.fulfilment_outage == FULFILMENT_OUTAGE
               else f" --fulfilment-outage {options.fulfilment_outage:g}")
            + ("" if options.not_allowed == NOT_ALLOWED else f" --not-allowed {options.not_allowed:g}")
            + ("" if options.identity_outage == IDENTITY_OUTAGE else f" --identity-outage {options.identity_outage:g}")
            + ("" if options.cosmos_outage == COSMOS_OUTAGE else f" --cosmos-outage {options.cosmos_outage:g}")
            + ("" if options.claims == "both" else f" --claims {options.claims}")
            + ("" if options.rollback == ROLLBACK_SECONDS else f" --rollback {options.rollback:g}"))


@dataclass(frozen=True)
class Options:
    """One run's options (the command line's)."""

    orders: int
    hosts: int
    seed: int
    rate: float
    results: Path
    plant: str | None
    upgrade: bool = True
    events_sessions: bool = True
    storms: int = STORMS
    storm_copies: int = STORM_COPIES
    fulfilment: str = "standard"
    fulfilment_outage: float = 180.0
    cosmos_outage: float = 120.0
    claims: str = "both"
    not_allowed: float = 60.0
    identity_outage: float = 120.0
    rollback: float = ROLLBACK_SECONDS

    def outages(self) -> list[tuple[str, float]]:
        """The outage phase's plan: each kind (faults.OUTAGE_KINDS) with its seconds, in order; those of 0 left out."""
        return [(kind, seconds) for kind, seconds in (
            ("fulfilment", self.fulfilment_outage), ("not-allowed", self.not_allowed),
            ("identity", self.identity_outage), ("cosmos", self.cosmos_outage)) if seconds > 0]

    def token_lifetime(self) -> float:
        """How long the local identity endpoint's tokens live in this run."""
        if not self.identity_outage:
            return 3600.0
        return max(TOKEN_LIFETIME_LEAST, self.identity_outage * TOKEN_LIFETIME_SHARE)

    def token_leeway(self) -> float:
        """How long past its expiry the stand-in takes a token: half its life with an identity outage, so that a
        token's life and leeway end well inside the outage (a host still using an expired token is refused)."""
        return self.token_lifetime() / 2 if self.identity_outage else Tokens.leeway


FULFILMENT_OUTAGE, COSMOS_OUTAGE = Options.fulfilment_outage, Options.cosmos_outage
NOT_ALLOWED, IDENTITY_OUTAGE = Options.not_allowed, Options.identity_outage


def run(options: Options) -> int:
    """One chaos run; 0 when every invariant holds."""
    orders, hosts, seed, rate, results, plant = (options.orders, options.hosts, options.seed, options.rate,
                                                  options.results, options.plant)
    scenario = plan(orders, seed, storms=options.storms, storm_copies=options.storm_copies)
    print(f"chaos: {orders} orders, {len(scenario.everything())} messages, {hosts} hosts, seed {seed}"
          + (f", planted bug {plant!r}" if plant else "") + ("" if options.upgrade else ", no rolling upgrade")
          + ("" if options.events_sessions else ", events without sessions")
          + ("" if options.fulfilment == "standard" else f", a fulfilment service of behaviour {options.fulfilment!r}")
          + f", reservation claims {CLAIMS[options.claims]}", flush=True)
    replay = replay_command(options)
    journal = Path(tempfile.mkdtemp(prefix="chaos-journal-")) / "writes.log"
    run_so_far = report.Run(seed, hosts, 0, {}, replay, plant)
    opened: list[Callable[[], object]] = []  # what to stop at the end, last opened first
    phase = "the start of the stack"
    try:
        stack = Stack.start(lock_seconds=LOCK_SECONDS, events_sessions=options.events_sessions,
                            fulfilment=FULFILMENT_BEHAVIOURS[options.fulfilment],
                            token_lifetime=options.token_lifetime(), token_leeway=options.token_leeway())
        opened += [functools.partial(_keep_logs, stack, results), stack.stop]
        chaos = Chaos(stack, seed, versions.app_dir(versions.CURRENT, journal, plant), RETRY_SETTINGS,
                      claims=options.claims)
        opened += [chaos.close, chaos.halt]  # stopped first: no host is brought back once the stack stops them
        probe = LatencyProbe(stack.cosmos.endpoint, stack.cosmos.key)
        watch = observe.Watch(stack)
        opened += [watch.close, probe.stop]

        def so_far() -> report.Run:
            return report.Run(seed, hosts, len(stack.retired), chaos.faults(), replay, plant, chaos.failure, probe,
                              None, chaos.upgraded)

        phase = "the start of the hosts"
        chaos.start_hosts(hosts)
        probe.start()
        print(f"chaos: {hosts} hosts listening, each behind its own fault proxies; sending and killing", flush=True)
        sent_at: dict[str, float] = {}
        started = time.time()
        phase = "the sending"
        # The operator after the rollback: this release's sbctl maps back what the release before dead-lettered.
        map_back = MapBack(stack.broker.connection_string, ("orders", stack.events_queue), DETECTION_WINDOW_SECONDS)
        map_back.start()
        opened.append(map_back.stop)
        with ServiceBusClient.from_connection_string(stack.broker.connection_string) as client:
            _send_and_shake(chaos, options, client, scenario, sent_at, met_a_copy=map_back.found,
                            next_version=versions.app_dir(versions.NEXT, journal, plant),
                            previous=versions.app_dir(versions.PREVIOUS, journal, plant))
            phase = "the drain"
            map_back.watch_for_quiet()  # the rollback is over: what it dead-lettered is all in the queues
            deadline = 300 + orders * SECONDS_PER_ORDER
            drained = observe.late_then_drain(stack, watch, client, scenario, sent_at, label="chaos",
                                              on_sent=chaos.stop, deadline=started + deadline,
                                              others_last_sent=map_back.last_sent)
            opened.remove(map_back.stop)
            if map_back.stop():  # a last pass found more: they are processed before the checks
                drained = observe.wait_drained(stack, watch, client, deadline=time.time() + 120, label="chaos")
            elapsed = time.time() - started
            stack.stop_hosts()  # so that the probes below are not taken by a host
            probe.stop()
            phase = "the checks after the drain"
            seen = observe.observed(stack, watch, client, sent_at, elapsed)
            upgrade = versions.check(journal, seen.documents, [*seen.accepted, *seen.rejected]) if options.upgrade \
                else None
            result = report.build(scenario, seen, dataclasses.replace(
                so_far(), upgrade=upgrade, drained=None if drained else f"not drained: nothing moved for"
                f" {observe.STALLED_SECONDS:.0f} s after {deadline:.0f} s",
                fulfilment=_fulfilment_figures(stack, options.fulfilment),
                outages=_outage_figures(chaos, stack),
                cosmos_outages=demo_report.Outages(
                    [(o.start, o.end) for o in chaos.outages if o.dependency == "cosmos"], DETECTION_WINDOW_SECONDS),
                rollback={"hosts rolled back to the release before": chaos.rolled_back,
                          "due set by sbctl index backfill after it": chaos.backfilled,
                          "copies it dead-lettered, mapped back by sbctl": dict(map_back.resubmitted),
                          "resubmissions sbctl sent": dict(map_back.sent)}
                if _rolls_back(options) else None))
    except Exception as exc:  # the stack could not be observed, or the driver failed: no verdict on the invariants
        result = report.unobserved(so_far() if "so_far" in locals() else run_so_far, phase, exc)
    finally:
        for stop in reversed(opened):
            with contextlib.suppress(Exception):
                stop()
    return _verdict(result, results, seed, replay)


def _roll_back_then_backfill(chaos: Chaos, previous: Path, met_a_copy: Callable[[], bool], seconds: float) -> None:
    """One slot on the release before for a while, then forward again; then, every host on this release, the
    operator's ``sbctl index backfill`` sets ``due`` on what the release before wrote without it (through the
    stack's own Cosmos endpoint, not a slot's proxy). A backfill that fails fails the run."""
    chaos.rollback(previous, seconds, met=met_a_copy, longest=3 * seconds)
    try:
        chaos.backfilled = backfill(chaos.stack.cosmos.endpoint, chaos.stack.cosmos.key)
    except Exception as exc:  # the run reports it as its failure
        chaos.failure = f"sbctl index backfill after the rollback failed: {type(exc).__name__}: {exc}"
    print(f"chaos: sbctl index backfill after the rollback: {chaos.backfilled}", flush=True)


def _send_and_shake(chaos: Chaos, options: Options, client: ServiceBusClient, scenario: Scenario,
                    sent_at: dict[str, float], *, next_version: Path, previous: Path,
                    met_a_copy: Callable[[], bool]) -> None:
    """Send the scenario while the killer and the slower run, the hosts are upgraded half-way through, and the
    outage phase takes the fulfilment service down, has it refuse the app's identity, takes the identity
    endpoint and then Cosmos DB down, one host rolled back to the release before
    as the fulfilment service comes back (its backlog's copies coming due), and kept back until ``met_a_copy``
    says it dead-lettered one (up to three times as long); return once all of it is over."""
    chaos.start()
    halfway = threading.Event()
    senders = observe.start_senders(client, scenario, sent_at, halfway, options.rate, stack=chaos.stack)
    sending = len(scenario.everything()) / options.rate
    upgrader = _start_upgrade(chaos, options, next_version, halfway, sending_seconds=sending)
    first_after = OUTAGE_FROM_SHARE * sending
    outages = chaos.outage_phase(
        options.outages(), first_after=first_after, gap=OUTAGE_GAP_SHARE * sending,
        after_rollback=chaos.rolled_forward if _rolls_back(options) else None)
    rollback = None
    if _rolls_back(options):
        rollback = threading.Timer(first_after + options.fulfilment_outage, _roll_back_then_backfill,
                                   args=(chaos, previous, met_a_copy, options.rollback))
        rollback.daemon = True
        rollback.start()
    for thread in senders:
        thread.join()
    if upgrader is not None:
        upgrader.join()
    outages.join()
    if rollback is not None:
        rollback.join()


def _rolls_back(options: Options) -> bool:
    """Whether the run rolls a host back to the release before: with the upgrade, when there are copies in flight
    for it to meet (the fulfilment outage's), unless ``--rollback 0``."""
    return options.upgrade and options.fulfilment_outage > 0 and options.rollback > 0


def _fulfilment_figures(stack: Stack, behaviour: str) -> dict[str, Any]:
    """The fulfilment stand-in's behaviour, and what it answered: 409s for a key in flight, keys forgotten."""
    server = stack.fulfilment
    keys = server.keys()
    statuses = Counter(call.status for key in keys for call in server.calls(key))
    return {"behaviour": behaviour, **FULFILMENT_BEHAVIOURS[behaviour],
            "answered 409, key in flight": statuses.get(409, 0), "keys forgotten, then asked for again":
                server.forgotten_keys(), "calls": sum(statuses.values()),
            # The stand-in admits only the app's managed identity's token (its token mode): a call refused for its
            # token carried none, or none valid (the 401s of the outage phase, to every call, are not these).
            "answered 401, no valid token": server.token_refusals(),
            "tokens issued by the identity endpoint": stack.identity.issued if stack.identity else 0}


def _outage_figures(chaos: Chaos, stack: Stack) -> list[dict[str, Any]]:
    """Each outage: how long, and the requests the dependency received meanwhile (the stand-in's reservation
    calls; the Cosmos proxies' requests refused)."""
    keys = stack.fulfilment.keys()
    calls = [call for key in keys for call in stack.fulfilment.calls(key)]
    refused = {"cosmos": sum(slot.cosmos.counts.get(OUTAGE, 0) for slot in chaos.slots),
               "identity": stack.identity.refused if stack.identity else 0}
    issued = list(stack.identity.issued_at) if stack.identity else []
    return [{"dependency": outage.dependency, "answered": outage.answered, "seconds": round(outage.end - outage.start),
             "requests received while down": refused[outage.kind] if outage.kind in refused else
             sum(outage.start <= call.time < outage.end for call in calls),
             # The hosts' tokens expired during it, and they asked for new ones after it.
             **({"tokens issued after it": sum(t >= outage.end for t in issued)} if outage.kind == "identity" else {})}
            for outage in chaos.outages]


def _keep_logs(stack: Stack, results: Path) -> None:
    """Every host's log (ids, hashes and outcomes; no payloads) as hosts.log beside the table, to trace a
    violation's document through the hosts that touched it."""
    results.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        (results / "hosts.log").write_text(stack.logs())


def _verdict(result: demo_report.Report, results: Path, seed: int, replay: str) -> int:
    """Print and keep the table; 1 with the seed and the replay command when anything was violated."""
    print(report.table(result), flush=True)
    report.write(result, results)
    print(f"chaos: wrote {results / 'chaos.json'} and {results / 'chaos.md'}", flush=True)
    if result.violations:
        for violation in result.violations[:20]:
            print(f"- {violation}", flush=True)
        print(f"chaos: {len(result.violations)} invariant violations with seed {seed}; replay: {replay}", flush=True)
        return 1
    return 0


def _start_upgrade(chaos: Chaos, options: Options, next_version: Path, halfway: threading.Event, *,
                   sending_seconds: float) -> threading.Thread | None:
    """Once half the orders are sent, replace the hosts one by one by hosts on the next version, so that
    the upgrade ends at about nine tenths of the sending."""
    if not options.upgrade:
        return None
    every = sending_seconds * UPGRADE_SHARE / options.hosts

    def upgrade() -> None:
        if halfway.wait(2 * sending_seconds + 60):
            print(f"chaos: half the orders sent; rolling upgrade, one host every {every:.0f} s", flush=True)
            chaos.upgrade(next_version, every)

    thread = threading.Thread(target=upgrade, name="chaos-upgrade", daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run."""
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", type=int, default=3500,
                        help="orders in the scenario (default 3500: 11,534 messages with seed 1, 4 of them storms)")
    parser.add_argument("--hosts", type=int, default=4, help="competing host processes (default 4, at least 2)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the scenario and of the fault plan (default 1)")
    parser.add_argument("--rate", type=float, default=24.0,
                        help="messages a second the producers send, orders and events together (default 24); the"
                             " faults and kills go on for as long as they send")
    parser.add_argument("--results", type=Path, default=ROOT / "results" / "chaos",
                        help="where chaos.json and chaos.md go (default results/chaos)")
    parser.add_argument("--plant", choices=sorted(planted.PLANTS),
                        help="run on the app with a planted bug, to see the suite find it: "
                             + "; ".join(f"{name}: {why}" for name, (why, _) in planted.PLANTS.items()))
    parser.add_argument("--no-upgrade", dest="upgrade", action="store_false",
                        help="leave out the rolling upgrade (by default, from half-way through the sending, the hosts"
                             " are replaced one by one by hosts on a generated next version of the app) and the"
                             " rollback (one host on the release before delayed retries as the fulfilment service"
                             " comes back, its dead-lettered copies mapped back by sbctl)")
    parser.add_argument("--events-queue", choices=("sessions", "plain"), default="sessions",
                        help="the app's events on a session queue (default) or on a plain one, where one order's"
                             " events run at once on different hosts (ORDER_EVENTS_SESSIONS false)")
    parser.add_argument("--storm-orders", dest="storms", type=int, default=STORMS,
                        help="orders of the storm phase (default 4): each held back while its events are rebuilt and"
                             " resent under new ids, then sent after everything else")
    parser.add_argument("--storm-copies", type=int, default=STORM_COPIES,
                        help="copies of each of a storm order's events, each under a new id (default 120), and half as"
                             " many events past the order's last version")
    parser.add_argument("--fulfilment", choices=sorted(FULFILMENT_BEHAVIOURS), default="standard",
                        help="the fulfilment stand-in's behaviour: standard (default), or ietf: a request under a key"
                             " another still holds is answered 409, each new reservation takes up to 6 s, and keys are"
                             " forgotten 3,720 s after their reservation")
    parser.add_argument("--fulfilment-outage", type=float, default=FULFILMENT_OUTAGE, metavar="SECONDS",
                        help="the outage phase: the fulfilment stand-in refuses every reservation for this long, from"
                             " 15%% of the sending on (default 180; 0: none)")
    parser.add_argument("--not-allowed", type=float, default=NOT_ALLOWED, metavar="SECONDS",
                        help="then, after a pause of a tenth of the sending, the stand-in refuses the app's identity"
                             " for this long, 401 for the first half and 403 for the second (default 60; 0: none)")
    parser.add_argument("--identity-outage", type=float, default=IDENTITY_OUTAGE, metavar="SECONDS",
                        help="then, after the same pause, the local identity endpoint fails (500) for this long; the"
                             " hosts' tokens live a third of it, at least 10 s (default 120; 0: none, and tokens"
                             " live an hour)")
    parser.add_argument("--cosmos-outage", type=float, default=COSMOS_OUTAGE, metavar="SECONDS",
                        help="then, after the same pause, every host's Cosmos proxy refuses every request for this long"
                             " (default 120; 0: none)")
    parser.add_argument("--claims", choices=sorted(CLAIMS), default="both",
                        help="where the hosts write a new order's reservation claim (RESERVATION_CLAIM_IN_ORDER):"
                             " both (default: every other slot inside the order, as while the setting rolls out),"
                             " in-order, or own (a document of its own)")
    parser.add_argument("--rollback", type=float, default=ROLLBACK_SECONDS, metavar="SECONDS",
                        help="as the fulfilment service comes back, one host runs the release before delayed retries"
                             " for this long, up to three times as long until it has dead-lettered a copy for sbctl to"
                             " map back; the outages after the first wait for it (default 45, at most 180; 0: no"
                             " rollback)")
    args = parser.parse_args(argv)
    if min(args.fulfilment_outage, args.not_allowed, args.identity_outage, args.cosmos_outage, args.rollback) < 0:
        parser.error("--fulfilment-outage, --not-allowed, --identity-outage, --cosmos-outage and --rollback must not"
                     " be negative")
    if args.rollback > LONGEST_ROLLBACK:
        parser.error(f"--rollback at most {LONGEST_ROLLBACK:g}: the outages after the first wait for the rollback,"
                     " up to three times as long, and no longer than faults.ROLLBACK_WAIT_LIMIT_SECONDS")
    if args.orders < 1 or args.hosts < 2 or args.rate <= 0 or not 0 <= args.storms <= args.orders \
            or args.storm_copies < 0:
        parser.error("--orders must be at least 1, --hosts at least 2, --rate above 0, --storm-orders from 0 to"
                     " --orders and --storm-copies at least 0")
    return run(Options(args.orders, args.hosts, args.seed, args.rate, args.results, args.plant, args.upgrade,
                       args.events_queue == "sessions", args.storms, args.storm_copies, args.fulfilment,
                       args.fulfilment_outage, args.cosmos_outage, args.claims, args.not_allowed,
                       args.identity_outage, args.rollback))


if __name__ == "__main__":
    sys.exit(main())
