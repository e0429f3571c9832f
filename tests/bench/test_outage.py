"""bench.outage's smoke run: the fulfilment stand-in down for a few seconds under a few orders, with the breaker and
without; every order reserved once both times, and the requests the service received while down counted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.devservers.helptext import options_without_help, run_module
from tests.host.conftest import LIGHT_STACK_B, NEEDS_313, ROOT


@NEEDS_313
@LIGHT_STACK_B
@pytest.mark.timeout(600)
def test_the_smoke_run_counts_what_the_service_received_while_down_with_the_breaker_and_without(
    tmp_path: Path,
) -> None:
    out = tmp_path / "outage.json"
    run = subprocess.run([sys.executable, "-m", "bench.outage", "--orders", "30", "--rate", "10", "--outage", "8",
                          "--after", "0.5", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=550, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    on, off = json.loads(out.read_text())["runs"]
    assert (on["breaker_open_seconds"], off["breaker_open_seconds"]) == (30.0, 0.0)
    for figures in (on, off):
        assert figures["reserved_once"] and figures["orders"] == 30
        assert figures["requests_while_down"] > 0 and figures["handed_on"] > 0
        assert figures["requests_in_all"] >= figures["requests_while_down"] + 30
    assert off["breakers_opened"] == 0 and off["handed_on_untried"] == 0
    assert "Requests while down, without the breaker against with it" in run.stdout


def test_bad_usage_is_one_line_and_exit_status_2() -> None:
    run = run_module("bench.outage", "--outage", "0")
    assert run.returncode == 2 and "--outage above 0" in run.stderr and "Traceback" not in run.stderr


def test_every_option_has_help() -> None:
    run = run_module("bench.outage", "--help")
    assert run.returncode == 0 and not options_without_help(run.stdout)
