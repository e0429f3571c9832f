"""The demo's short variant: the whole stack, three hosts, 200 orders; every invariant holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.host.conftest import NEEDS_313, WHOLE_STACK_B

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [NEEDS_313, WHOLE_STACK_B, pytest.mark.timeout(1800)]


def test_the_short_demo_drains_and_every_invariant_holds(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "demo", "--orders", "200", "--seed", "3", "--outage", "20",
                          "--results", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=1500, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    figures = json.loads((tmp_path / "demo.json").read_text())
    assert figures["violations"] == []
    # The 200 orders, then 20 more at a steady rate, on which the latency on the first screen is measured.
    assert figures["orders"] == 220
    # One outcome each, but for an order its status would contradict: cancelled while its reservation waited out
    # the outage (or shipped, then refused), recorded and not announced.
    refused = figures["orders out of stock"]
    unannounced = figures["outcomes unannounced, the order cancelled or shipped"]
    assert figures["orders written"] == 220 and unannounced > 0
    assert figures["OrderAccepted"] + figures["OrderRejected"] == 220 - unannounced
    assert figures["OrderAccepted"] <= figures["reservations"] <= figures["OrderAccepted"] + unannounced
    assert figures["OrderRejected"] <= refused and refused > 0
    assert figures["steady messages"] > 20 and figures["latency p99 ms"] >= figures["latency p50 ms"] > 0
    assert figures["dead letters"] == figures["dead letters planned"]
    assert figures["duplicates absorbed by the consumer"] > 0 and figures["events parked"] > 0
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    # The fulfilment service down for 20 s: orders handed on, and reserved once it came back.
    outage = figures["outage"]
    assert outage["seconds"] == 20 and outage["requests received while down"] > 0 and outage["handed on"] > 0
    assert outage["last reservation after the service came back, s"] is not None
    assert "recovered: the last reservation after the service came back" in run.stdout
    assert "invariant violations" in run.stdout and "at a steady" in run.stdout
    # The operator's workbook drawn from the run's own records, with the queries the Bicep deploys.
    picture = tmp_path / "workbook.png"
    drawn = subprocess.run([sys.executable, "-m", "demo.workbook", "--logs", str(tmp_path / "hosts.log"), "--out",
                            str(picture)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert drawn.returncode == 0 and "6 panels over" in drawn.stdout, drawn.stderr
    assert picture.stat().st_size > 10_000
