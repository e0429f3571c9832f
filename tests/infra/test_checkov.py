"""Checkov scans infra/ with no failed checks; every skip carries its reason inline, at the resource."""

from __future__ import annotations

import json
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Checkov pins libraries that clash with the test tools, so `make setup` gives it a venv of its own.
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
# One scan read by both tests: they go to one pytest worker together under make test's --dist loadgroup.
pytestmark = pytest.mark.xdist_group("checkov")


@cache
def scan() -> list[dict[str, Any]]:
    assert CHECKOV.exists(), f"{CHECKOV} is missing: run `make setup`"
    # --skip-download: no policy metadata from the network; the built-in checks are what we run.
    run = subprocess.run(
        [str(CHECKOV), "-d", str(ROOT / "infra"), "--skip-download", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = json.loads(run.stdout)
    return report if isinstance(report, list) else [report]


def test_checkov_scans_the_bicep_and_finds_no_failed_checks() -> None:
    reports = scan()
    bicep = [r for r in reports if r["check_type"] == "bicep"]
    assert bicep and bicep[0]["summary"]["resource_count"] >= 20
    failed = [(c["check_id"], c["resource"]) for r in reports for c in r["results"]["failed_checks"]]
    assert failed == []
    assert all(r["summary"]["parsing_errors"] == 0 for r in reports)


def test_every_skip_is_justified_inline() -> None:
    skipped = [c for r in scan() for c in r["results"]["skipped_checks"]]
    assert skipped, "the templates document their accepted risks as inline skips"
    for check in skipped:
        reason = (check["check_result"].get("suppress_comment") or "").strip()
        assert len(reason) >= 20, (check["check_id"], check["resource"], reason)
