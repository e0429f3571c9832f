"""``python -m bench.host_path``: the order app's path through the local Functions host, against an app that only
settles, side by side in one run.

One local stack (demo/stack.py: the broker, the Cosmos server, the fulfilment stand-in, Azurite). Two apps, each
run ``--rounds`` times, alternating which goes first:

- **settle-only**: one function, ``process_order``, on the same queue with the same trigger (PeekLock,
  ``auto_complete_messages=False``, the SDK-type binding) and the same host.json, which completes each message
  and does nothing else: the floor of the host path, what the host, the worker and the broker cost alone;
- **the order app**: function_app.py as deployed, on the library: each OrderPlaced is an order and its claim in
  one batch, a reservation call to the stand-in, and its finish with the outcome's outbox entry, which the
  change feed's publisher then sends.

``--baseline DIR`` adds a third app, measured in the same rounds: the order app as an earlier commit had it (a
``git worktree`` of that commit), to compare the library's host path with the app's own before it.

For each run, ``--messages`` valid OrderPlaced messages are sent while no host runs, then one host of the app is
started, and its drain rate is settlements per second, first to last, from the host's own log lines
(``process_order messageId=... outcome=Succeeded settlement=complete``, stamped by the host's clock right after
the broker took the settlement). The host is stopped once every message is settled. The ratio is the order app's
rate over the settle-only app's (and over the baseline's), per round, and their median.

    python -m bench.host_path [--messages 400] [--rounds 3] [--seed 1] [--baseline DIR] [--json PATH]

Figures come from this machine's run and are compared only within it; no test times them.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from azure.servicebus import ServiceBusClient, ServiceBusMessage

from bench.events import send_batched
from demo.stack import ROOT, Stack, settings_file
from sbctl import generate

NEVER = "0 0 0 1 1 *"  # a timer schedule that does not come round during a run
_SETTLED = re.compile(r"^(\S+ \S+) devservers\.host process_order messageId=(\S+) outcome=Succeeded"
                      r" settlement=complete", re.M)
SETTLE_ONLY = '''"""Settle-only, the host path's floor: completes each message on the order app's queue, and no more."""

import azure.functions as func
from azurefunctions.extensions.bindings import servicebus

app = func.FunctionApp()


@app.function_name("process_order")
@app.service_bus_queue_trigger(arg_name="msg", queue_name="orders", connection="ServiceBusConnection",
                               auto_complete_messages=False)
def process_order(msg: servicebus.ServiceBusReceivedMessage,
                  message_actions: servicebus.ServiceBusMessageActions) -> None:
    message_actions.complete(msg)
'''


def settle_only_app() -> Path:
    """The settle-only app, in a new temporary folder, with the order app's host.json."""
    folder = Path(tempfile.mkdtemp(prefix="settle-only-"))
    (folder / "function_app.py").write_text(SETTLE_ONLY)
    shutil.copy(ROOT / "host.json", folder / "host.json")
    return folder


def _moment(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def drain(stack: Stack, app_dir: Path, settings: Path, rng: random.Random, *, messages: int,
          timeout: float) -> float:
    """Send ``messages`` orders, start one host of the app, and wait until each is settled; its settlements per
    second, first to last. RuntimeError when they are not all settled within ``timeout`` seconds."""
    bodies = [generate.order(rng) for _ in range(messages)]
    with ServiceBusClient.from_connection_string(stack.broker.connection_string) as client, \
            client.get_queue_sender("orders") as sender:
        send_batched(sender, [ServiceBusMessage(json.dumps(b), message_id=b["orderId"]) for b in bodies])
    ids = {b["orderId"] for b in bodies}
    host = stack.start_host(settings, app_dir)
    deadline = time.monotonic() + timeout
    try:
        while True:
            settled = {m[2]: _moment(m[1]) for m in _SETTLED.finditer(host.text()) if m[2] in ids}
            if len(settled) == messages:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{app_dir.name}: {len(settled)} of {messages} messages settled in {timeout:.0f} s;"
                                   " the host's log is in the stack's logs")
            time.sleep(0.5)
    finally:
        stack.stop_host(host)
    first, last = min(settled.values()), max(settled.values())
    return (messages - 1) / (last - first) if last > first else float(messages)


def run(messages: int, rounds: int, seed: int, timeout: float, baseline: Path | None = None) -> dict[str, object]:
    """The whole run: each app's rate per round, the ratios and their medians."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible workload, not a secret
    stack = Stack.start()
    floor_dir = settle_only_app()
    apps = [("settle-only", floor_dir), ("order app", ROOT)] + ([("baseline", baseline)] if baseline else [])
    rates: dict[str, list[float]] = {name: [] for name, _ in apps}
    try:
        values = {**stack.values, "OUTBOX_SWEEP_SCHEDULE": NEVER, "STUCK_REPORT_SCHEDULE": NEVER}
        settings = settings_file(values)
        for n in range(rounds):
            for name, app_dir in apps[n % len(apps):] + apps[:n % len(apps)]:  # each app first in turn
                rates[name].append(drain(stack, app_dir, settings, rng, messages=messages, timeout=timeout))
    finally:
        stack.stop()
        shutil.rmtree(floor_dir, ignore_errors=True)
    ratios = {"order app / settle-only": _ratios(rates["order app"], rates["settle-only"])}
    if baseline:
        ratios["baseline / settle-only"] = _ratios(rates["baseline"], rates["settle-only"])
        ratios["order app / baseline"] = _ratios(rates["order app"], rates["baseline"])
    return {"messages": messages, "rounds": rounds, "rates": rates, "ratios": ratios,
            "medians": {name: statistics.median(values) for name, values in ratios.items()}}


def _ratios(top: list[float], bottom: list[float]) -> list[float]:
    return [a / b for a, b in zip(top, bottom, strict=True)]


def table(figures: dict[str, Any]) -> str:
    """The run as a Markdown table and its median ratios."""
    rates, ratios = figures["rates"], figures["ratios"]
    names = list(rates)
    lines = ["| round | " + " | ".join(f"{name}, messages/s" for name in names) + " | " + " | ".join(ratios) + " |",
             "| --- |" + " --- |" * (len(names) + len(ratios))]
    for n in range(figures["rounds"]):
        lines.append(f"| {n + 1} | " + " | ".join(f"{rates[name][n]:.1f}" for name in names) + " | "
                     + " | ".join(f"{values[n]:.2f}x" for values in ratios.values()) + " |")
    lines.append("")
    lines += [f"{name}, median of {figures['rounds']}: {median:.2f}x" for name, median in figures["medians"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.host_path", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=400, help="OrderPlaced messages per run (default 400)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each app, alternating (default 3)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the generated orders (default 1)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a run may take to settle every message")
    parser.add_argument("--baseline", type=Path, help="an earlier commit's app folder (a git worktree), measured too")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.messages < 2 or args.rounds < 1:
        parser.error("--messages must be at least 2 and --rounds at least 1")
    if args.baseline is not None and not (args.baseline / "function_app.py").is_file():
        parser.error(f"--baseline {args.baseline}: no function_app.py there (make one with git worktree add)")
    try:
        figures = run(args.messages, args.rounds, args.seed, args.timeout, args.baseline)
    except RuntimeError as exc:
        print(f"bench.host_path: {exc}", file=sys.stderr)
        return 1
    print(table(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
