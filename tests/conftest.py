"""Session-wide test set-up: shared fixtures, and the OpenTelemetry SDK reader installed first."""

from __future__ import annotations

from tests.support.metrics import metric_reader

pytest_plugins = ["tests.support.fake_host", "tests.support.cosmos", "tests.support.aio"]

metric_reader()
