"""bench.events' smoke run: one host, a small burst and a short steady phase; no timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.devservers.helptext import options_without_help, run_module
from tests.host.conftest import LIGHT_STACK, NEEDS_313, ROOT


@NEEDS_313
@LIGHT_STACK
@pytest.mark.timeout(600)
def test_the_smoke_run_drains_the_burst_and_reports_the_steady_rate_and_the_sessions(tmp_path: Path) -> None:
    out = tmp_path / "events.json"
    run = subprocess.run([sys.executable, "-m", "bench.events", "--burst", "12", "--seconds", "3", "--rate", "2",
                          "--events-queue", "both", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=500, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    sessions, plain = json.loads(out.read_text())["runs"]
    for figures in (sessions, plain):
        assert figures["burst_orders"] == 12 and figures["burst_events"] >= 12 and not figures["capped"]
        assert figures["orders_per_second"] > 0 and figures["events_per_second"] > 0
        assert figures["steady_orders"] == 6 and figures["latency_max_seconds"] >= figures["latency_p50_seconds"] > 0
        # The proxy saw the events' writes: at least one request per event.
        assert figures["requests_per_event"] >= 1
    # Every session the burst and the steady phase opened was let go and logged; without sessions, none.
    assert sessions["sessions"]["released"] >= 12 and sessions["sessions"]["idle max s"] >= 0.2
    assert plain["events_queue"] == "plain" and plain["sessions"] == {}
    assert run.stdout.count("events against orders") == 2


def test_bad_usage_is_one_line_and_exit_status_2() -> None:
    run = run_module("bench.events", "--service-bus", "{not json")
    assert run.returncode == 2 and "--service-bus is not JSON" in run.stderr and "Traceback" not in run.stderr


def test_every_option_has_help() -> None:
    run = run_module("bench.events", "--help")
    assert run.returncode == 0 and not options_without_help(run.stdout)
