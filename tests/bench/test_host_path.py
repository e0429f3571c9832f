"""bench.host_path's smoke run: both apps drain a few messages through the local host; no timing is asserted."""

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
@pytest.mark.timeout(300)
def test_the_smoke_run_drains_both_apps_and_reports_their_ratio(tmp_path: Path) -> None:
    out = tmp_path / "host_path.json"
    run = subprocess.run([sys.executable, "-m", "bench.host_path", "--messages", "12", "--rounds", "1",
                          "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    figures = json.loads(out.read_text())
    [floor], [app] = figures["rates"]["settle-only"], figures["rates"]["order app"]
    assert floor > 0 and app > 0
    assert figures["ratios"] == {"order app / settle-only": [app / floor]}
    assert figures["medians"] == {"order app / settle-only": app / floor}
    assert "order app / settle-only, median of 1" in run.stdout


def test_bad_usage_is_one_line_and_exit_status_2() -> None:
    run = run_module("bench.host_path", "--messages", "1")
    assert run.returncode == 2 and "--messages must be at least 2" in run.stderr and "Traceback" not in run.stderr


def test_a_baseline_without_an_app_is_one_line_and_exit_status_2(tmp_path: Path) -> None:
    run = run_module("bench.host_path", "--baseline", str(tmp_path))
    assert run.returncode == 2 and "no function_app.py there" in run.stderr and "Traceback" not in run.stderr


def test_every_option_has_help() -> None:
    run = run_module("bench.host_path", "--help")
    assert run.returncode == 0 and not options_without_help(run.stdout)
