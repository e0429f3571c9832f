"""A real OpenTelemetry SDK meter provider with an in-memory reader, installed once per test session."""

from __future__ import annotations

from collections import Counter
from functools import cache

from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Sum

from idempotent_consumer.telemetry import OUTCOME_COUNTER, OVERDUE_COUNTER


@cache
def metric_reader() -> InMemoryMetricReader:
    """Install the SDK provider on first call (the global can be set only once) and return its reader."""
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader


def _counts(name: str, keys: tuple[str, str]) -> Counter[tuple[str, str]]:
    counts: Counter[tuple[str, str]] = Counter()
    data = metric_reader().get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != name:
                    continue
                assert isinstance(metric.data, Sum), metric.data  # a counter's points are numbers
                for point in metric.data.data_points:
                    attrs = point.attributes or {}
                    counts[(str(attrs[keys[0]]), str(attrs[keys[1]]))] += int(point.value)
    return counts


def outcome_counts() -> Counter[tuple[str, str]]:
    """Cumulative deliveries counted so far, by (function, outcome)."""
    return _counts(OUTCOME_COUNTER, ("function", "outcome"))


def overdue_counts() -> Counter[tuple[str, str]]:
    """Cumulative overdue items counted so far, by (kind, orderId)."""
    return _counts(OVERDUE_COUNTER, ("kind", "orderId"))
