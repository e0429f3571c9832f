"""Cold start: ``import function_app`` against a minimal app with one SDK-type Service Bus trigger, and the payments
example's (``examples/payments``: a consumer on the library's ``Consumer`` blueprint) beside them.

Each figure is the median wall time of N fresh interpreter processes that import the module and exit,
measured in one run, alternating between them so that all see the same machine state, with telemetry on
as in Azure (Application Insights' connection string set). The app imports its clients' modules
(aiohttp, azure.cosmos.aio) and the counters' exporter on the first invocation, not when the host
indexes it: ``first invocation`` adds those imports and the exporter's set-up, the part of the cold
start that moved there.

``--baseline DIR`` adds an earlier commit's app (its folder, from ``git archive``), imported in the same rounds: the
cold start the library's refactors are held to. Both apps are also built as on the first invocation
(``import function_app; function_app.root()``: the app and its handlers, without the clients' modules, which
both import alike on their first request), so that what indexing no longer loads is counted where it went.

    python -m bench.cold_start [--runs 10] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the project root, above tools/
PAYMENTS = ROOT / "examples" / "payments"  # its function_app.py imports the library from the root (PYTHONPATH)
MINIMAL_APP = '''
import azure.functions as func
import azurefunctions.extensions.bindings.servicebus as servicebus

app = func.FunctionApp()


@app.service_bus_queue_trigger(arg_name="msg", queue_name="orders", connection="ServiceBusConnection",
                               auto_complete_messages=False)
def handle(msg: servicebus.ServiceBusReceivedMessage, message_actions: servicebus.ServiceBusMessageActions) -> None:
    message_actions.complete(msg)
'''


# What the first invocation imports besides: the Cosmos DB and fulfilment clients (shared.bootstrap), and,
# with Application Insights set, the counters' exporter that function_app.root installs.
FIRST_INVOCATION = "function_app, idempotent_consumer.adapters.cosmos, shared.adapters.http; function_app.root()"
# The app built as on the first invocation, in this commit's app and a baseline's alike (telemetry off).
BUILT = "function_app; function_app.root()"
# Telemetry on, as in Azure: a connection string (to a closed loopback port: nothing is sent in a run
# this short) and no statsbeat, the exporter's own usage report.
TELEMETRY = {"APPLICATIONINSIGHTS_CONNECTION_STRING": "InstrumentationKey=00000000-0000-0000-0000-000000000000;"
             "IngestionEndpoint=http://127.0.0.1:9/", "APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL": "true"}


def _import_seconds(module: str, cwd: Path, env: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {module}"], cwd=cwd, check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", **(env or {})})
    return time.perf_counter() - started


def measure(runs: int, baseline: Path | None = None) -> dict[str, float]:
    """Median seconds to import the app and the minimal app, and their ratio (and an earlier commit's app's)."""
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "minimal_app.py").write_text(MINIMAL_APP)
        app, first, quiet, minimal, payments, before, built, built_before = [], [], [], [], [], [], [], []
        for _ in range(runs):
            app.append(_import_seconds("function_app", ROOT, TELEMETRY))
            if baseline is not None:
                before.append(_import_seconds("function_app", baseline, TELEMETRY))
                built.append(_import_seconds(BUILT, ROOT))
                built_before.append(_import_seconds(BUILT, baseline))
            payments.append(_import_seconds("function_app", PAYMENTS, {**TELEMETRY, "PYTHONPATH": str(ROOT)}))
            first.append(_import_seconds(FIRST_INVOCATION, ROOT, TELEMETRY))
            quiet.append(_import_seconds(FIRST_INVOCATION, ROOT))
            minimal.append(_import_seconds("minimal_app", Path(scratch)))
    result = {"app_s": statistics.median(app), "first_invocation_s": statistics.median(first),
              "first_invocation_no_telemetry_s": statistics.median(quiet), "minimal_s": statistics.median(minimal),
              "payments_s": statistics.median(payments)}
    result["payments_ratio"] = result["payments_s"] / result["minimal_s"]
    result["ratio"] = result["app_s"] / result["minimal_s"]
    result["first_invocation_ratio"] = result["first_invocation_s"] / result["minimal_s"]
    result["telemetry_s"] = result["first_invocation_s"] - result["first_invocation_no_telemetry_s"]
    if before:
        result["baseline_s"] = statistics.median(before)
        result["against_baseline"] = result["app_s"] / result["baseline_s"]
        result["built_s"], result["built_baseline_s"] = statistics.median(built), statistics.median(built_before)
        result["built_against_baseline"] = result["built_s"] / result["built_baseline_s"]
    return result


def main() -> None:
    """Print the medians and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="fresh processes per module (default 10)")
    parser.add_argument("--baseline", type=Path, help="an earlier commit's app folder, imported in the same rounds")
    args = parser.parse_args()
    if args.baseline is not None and not (args.baseline / "function_app.py").is_file():
        parser.error(f"--baseline {args.baseline}: no function_app.py there (make one with git archive)")
    figures = measure(args.runs, args.baseline)
    print(f"python {sys.version.split()[0]}, telemetry on: import function_app {figures['app_s'] * 1000:.0f} ms,"
          f" minimal SDK-type app {figures['minimal_s'] * 1000:.0f} ms, ratio {figures['ratio']:.2f}; with the"
          f" first invocation's imports and the exporter {figures['first_invocation_s'] * 1000:.0f} ms,"
          f" ratio {figures['first_invocation_ratio']:.2f}, of which the exporter"
          f" {figures['telemetry_s'] * 1000:.0f} ms; the payments example (the library's blueprint)"
          f" {figures['payments_s'] * 1000:.0f} ms, ratio {figures['payments_ratio']:.2f}")
    if "baseline_s" in figures:
        print(f"the baseline ({args.baseline}): import function_app {figures['baseline_s'] * 1000:.0f} ms; this"
              f" commit's against it {figures['against_baseline']:.2f}x; with the app built as on the first"
              f" invocation {figures['built_s'] * 1000:.0f} ms against {figures['built_baseline_s'] * 1000:.0f} ms,"
              f" {figures['built_against_baseline']:.2f}x")


if __name__ == "__main__":
    main()
