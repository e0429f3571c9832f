"""One structured record per delivery with ids and outcome only, and an OpenTelemetry counter."""

from __future__ import annotations

import logging

import pytest

from shared.domain.outcomes import Outcome, Result
from shared.telemetry import LOGGER_NAME, record_delivery
from tests.support.metrics import outcome_counts
from tests.support.orders import inbound, order_body


def test_record_has_ids_outcome_and_duration_but_no_payload(caplog: pytest.LogCaptureFixture) -> None:
    message = inbound(order_body("ord-7", customerId="alice@example.com"), delivery_count=2)
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        record_delivery("process_order", message, Result(Outcome.CREATED, request_hash="abc"), 12.345)
    [record] = caplog.records
    fields = vars(record)  # what ``extra`` set: LogRecord declares only the standard attributes
    assert fields["messageId"] == "ord-7"
    assert fields["correlationId"] == "corr-1"
    assert fields["deliveryCount"] == 2
    assert fields["outcome"] == "created"
    assert fields["durationMs"] == 12.3
    assert "alice@example.com" not in record.getMessage()
    assert "alice@example.com" not in repr(record.__dict__)


def test_rejections_are_logged_as_warnings(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        record_delivery("process_order", inbound(order_body("o")), Result(Outcome.INVALID, "currency bad"), 1)
    assert caplog.records[0].levelno == logging.WARNING
    assert "currency bad" in caplog.records[0].getMessage()


def test_outcomes_are_counted_by_function_and_outcome() -> None:
    before = outcome_counts()
    record_delivery("fn_a", inbound(order_body("o")), Result(Outcome.DUPLICATE), 1)
    record_delivery("fn_a", inbound(order_body("o")), Result(Outcome.DUPLICATE), 1)
    after = outcome_counts()
    assert after[("fn_a", "duplicate")] - before[("fn_a", "duplicate")] == 2
