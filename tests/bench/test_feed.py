"""``python -m bench.feed``'s smoke run: the change feed's pages, items and lease writes per order, from the local
host, counted through the proxy's observer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.feed import FeedCounter, Rate
from tests.devservers.helptext import REPO_ROOT, run_module
from tests.host.conftest import LIGHT_STACK, NEEDS_313


def test_the_counter_counts_feed_pages_items_empty_polls_and_lease_writes_only_while_a_rate_runs() -> None:
    counter = FeedCounter()
    feed, page = {"a-im": "Incremental feed"}, json.dumps({"Documents": [{"id": "a"}, {"id": "b"}]}).encode()
    counter("GET", "/dbs/sales/colls/orders/docs", feed, 200, page)  # before the rate: not counted
    counter.rate = rate = Rate(10, orders=2, events=3)
    counter("GET", "/dbs/sales/colls/orders/docs", feed, 200, page)
    counter("GET", "/dbs/sales/colls/orders/docs", feed, 304, b"")
    counter("PUT", "/dbs/sales/colls/leases/docs/lease-0", {}, 200, b"{}")
    counter("POST", "/dbs/sales/colls/leases/docs", {"x-ms-documentdb-isquery": "True"}, 200, b"{}")  # a query
    counter("POST", "/dbs/sales/colls/orders/docs", {}, 201, b"{}")  # the app's own write
    assert (rate.pages, rate.items, rate.empty_polls, rate.lease_writes) == (1, 2, 1, 1)
    assert rate.per_order() == {"pages": 0.5, "items": 1.0, "empty polls": 0.5, "lease writes": 0.5}


@NEEDS_313
@LIGHT_STACK  # with the shorter stack runs: the chaos smoke run, the longest, has its group to itself
@pytest.mark.timeout(600)
def test_the_smoke_run_counts_what_the_feed_read_and_wrote_per_order(tmp_path: Path) -> None:
    out = tmp_path / "feed.json"
    run = subprocess.run([sys.executable, "-m", "bench.feed", "--rates", "4", "--seconds", "2", "--json", str(out)],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=540, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    [rate] = json.loads(out.read_text())
    assert (rate["rate"], rate["orders"]) == (4, 8) and rate["events"] > 0
    per = rate["per order"]
    # Every order's documents reach the feed (its order, claim and entry at least), on pages that each end in a lease
    # checkpoint.
    assert per["items"] >= 3 and per["pages"] > 0 and rate["lease_writes"] > 0
    assert "| orders/s | orders |" in run.stdout


def test_bad_rates_are_one_line_and_exit_2() -> None:
    run = run_module("bench.feed", "--rates", "0")
    assert run.returncode == 2 and "every rate must be above 0" in run.stderr and "Traceback" not in run.stderr
