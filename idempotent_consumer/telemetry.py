"""One structured log record and one counter increment per delivery: ids, hashes and outcomes only.

The records reach Application Insights as ``traces`` through the Functions host, which forwards the
worker's logs. The counters go through the OpenTelemetry metrics API, a no-op until a provider is
installed: in Azure, ``export_to_azure_monitor`` installs one whose exporter sends them to Application
Insights as ``customMetrics`` (the function app calls it once, on its first invocation); a test
installs its own reader.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from opentelemetry import metrics

from idempotent_consumer import retries
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outcomes import Outcome, Result

LOGGER_NAME = "idempotent_consumer"
# Set by the platform when the app has Application Insights; the exporter reads it, and
# APPLICATIONINSIGHTS_AUTHENTICATION_STRING ("Authorization=AAD": the managed identity), itself.
CONNECTION_SETTING = "APPLICATIONINSIGHTS_CONNECTION_STRING"
EXPORT_INTERVAL_MS = 60_000
METER_NAME = "idempotent_consumer"
OUTCOME_COUNTER = "consumer.deliveries"
OVERDUE_COUNTER = "consumer.overdue"

logger = logging.getLogger(LOGGER_NAME)
QUIET_OUTCOMES = frozenset(
    {Outcome.CREATED, Outcome.APPLIED, Outcome.DUPLICATE, Outcome.STALE, Outcome.PARKED, Outcome.IN_PROGRESS,
     Outcome.TRANSIENT, Outcome.HANDED_ON, Outcome.ORDER_CLOSED}
)


# The API's proxy meter forwards to whichever provider is installed later, so one instrument suffices.
_deliveries = metrics.get_meter(METER_NAME).create_counter(
    OUTCOME_COUNTER, unit="{delivery}", description="Deliveries by function and outcome."
)


def delivery_fields(function: str, message: InboundMessage, result: Result, duration_ms: float,
                    now: datetime | None = None) -> dict[str, Any]:
    """The fields of the per-delivery record; payload contents never appear here. ``latencyMs`` is the message's
    end to end so far: from its enqueuing to this record, as the delivery is about to be settled (None when the
    binding passed no enqueued time)."""
    enqueued = message.enqueued_time_utc
    latency = round(((now or datetime.now(UTC)) - enqueued).total_seconds() * 1000, 1) if enqueued else None
    return {"function": function, "messageId": message.message_id, "correlationId": message.correlation_id,
            "deliveryCount": message.delivery_count, "outcome": result.outcome.value,
            "requestHash": result.request_hash, "durationMs": round(duration_ms, 1), "latencyMs": latency,
            "retryAttempt": retries.attempt_of(message.application_properties)}


def record_delivery(function: str, message: InboundMessage, result: Result, duration_ms: float) -> None:
    """Log the delivery's record and count its outcome. The message text carries what the workbook and the alerts
    read (infra/modules/workbook.bicep, alerts.bicep): they parse it, whether or not the fields reach
    customDimensions."""
    fields = delivery_fields(function, message, result, duration_ms)
    level = logging.INFO if result.outcome in QUIET_OUTCOMES else logging.WARNING
    retry = f" retryAttempt={fields['retryAttempt']}" if fields["retryAttempt"] else ""
    detail = f" detail={result.description}" if result.description else ""
    latency = "-" if fields["latencyMs"] is None else fields["latencyMs"]
    logger.log(level, "delivery %s messageId=%s outcome=%s latencyMs=%s deliveryCount=%s durationMs=%s%s%s", function,
               message.message_id, result.outcome.value, latency, message.delivery_count, fields["durationMs"],
               retry, detail, extra=fields)
    _deliveries.add(1, {"function": function, "outcome": result.outcome.value})


_overdue = metrics.get_meter(METER_NAME).create_counter(
    OVERDUE_COUNTER, unit="{item}", description="Parked events and side effects waiting too long, by kind and order."
)


def record_overdue(kind: str, order_id: str, detail: str) -> None:
    """Warn about one item waiting too long (an event parked, a side effect in progress) and count it."""
    logger.warning("overdue %s orderId=%s %s", kind, order_id, detail,
                   extra={"overdue": kind, "orderId": order_id})
    _overdue.add(1, {"kind": kind, "orderId": order_id})


def export_to_azure_monitor(environ: Mapping[str, str] = os.environ) -> bool:
    """Send the counters to Application Insights when the app has it (``CONNECTION_SETTING``); say whether.

    Only the metrics exporter and the SDK's metrics are imported, on first use: the Azure Monitor distro
    would also instrument the SDKs and HTTP clients and take over logging, which the host already does,
    for about three times the import (docs/performance.md, "Telemetry").
    """
    if not environ.get(CONNECTION_SETTING):
        return False
    # On first use only: about 0.3 s of imports that the host's indexing should not pay.
    from azure.monitor.opentelemetry.exporter import AzureMonitorMetricExporter  # noqa: PLC0415
    from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader  # noqa: PLC0415

    reader = PeriodicExportingMetricReader(AzureMonitorMetricExporter(connection_string=environ[CONNECTION_SETTING]),
                                           export_interval_millis=EXPORT_INTERVAL_MS)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return True
