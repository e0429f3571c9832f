"""The benchmark's smoke mode (part of the test command): the request counts on the wire, which are
deterministic; no timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

from bench import own_code, throughput
from tests.devservers.helptext import options_without_help, run_module


def test_the_smoke_run_counts_each_strategys_requests_and_the_project_sits_at_its_floor(tmp_path: Path) -> None:
    run = run_module("bench", "--smoke", "--results", str(tmp_path))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    figures = json.loads((tmp_path / "bench.json").read_text())
    assert figures["floor"] == {"new order": 2.0, "copy of an order": 2.0, "applied event": 2.0}
    counts = {(c["strategy"], c["workload"]): (c["requests per message"], c["requests per copy"])
              for c in figures["cells"]}
    # The alternatives' counts show the counter sees every request: raw create 1; check-then-write reads
    # then creates, and a copy stops at the read; the two-phase record writes three times, a copy reads it.
    assert counts["raw create", "new orders"] == (1.0, None)
    assert counts["check-then-write", "new orders"][0] == 2.0
    assert counts["check-then-write", "30% duplicates"][1] == 1.0
    assert counts["two-phase record", "new orders"][0] == 3.0
    assert counts["two-phase record", "30% duplicates"][1] == 2.0
    assert counts["this project + stand-in", "new orders"][0] == 2.0
    assert "not read: the local server answers a flat 1 per request" in (tmp_path / "bench.md").read_text()


def test_bad_usage_is_one_line_and_exit_status_2() -> None:
    run = run_module("bench", "--concurrency", "1,x")
    assert run.returncode == 2 and "not a comma-separated list of numbers" in run.stderr
    assert "Traceback" not in run.stderr


def test_every_option_has_help() -> None:
    run = run_module("bench", "--help")
    assert run.returncode == 0 and not options_without_help(run.stdout)


def test_the_memory_run_reports_its_own_peak_not_its_parents() -> None:
    ballast = b"\x01" * (300 * 1024 * 1024)  # written, so resident: the parent's peak, which ru_maxrss would carry over
    run = run_module("bench.memory", "--messages", "50")
    assert run.returncode == 0, run.stderr[-2000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    assert figures["messages"] == 50 and 0 < figures["peak_rss_mb"] < 250
    assert figures["fulfilment_ms"] > 0 and len(ballast) > 0


def test_the_own_code_figure_measures_the_happy_path() -> None:
    # Its ports answer at once; if they stopped fitting the handlers, another outcome would be timed.
    figures = own_code.measure(messages=40, warm_up=5)
    events = sum(len(unit) for unit in throughput.workload(throughput.EVENTS, 40, seed=3).units)
    assert figures["outcomes"] == {"created": 40, "applied": events}
    assert figures["new order ms"] > 0 and figures["applied event ms"] > 0
