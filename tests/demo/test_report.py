"""The report's trace of a dead letter the plan did not expect, and its recovery from the outage."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from demo import report

LOGS = """\
2026-12-03 15:31:07,348 devservers.host worker [9a39c97d] idempotent_consumer: delivery process_order_event \
messageId=evt-1 outcome=failed latencyMs=12.5 deliveryCount=None durationMs=7.2
2026-12-03 15:31:07,373 devservers.host process_order_event messageId=evt-1 outcome=Failed settlement=abandon 9 ms
2026-12-03 15:31:08,373 devservers.host process_order_event messageId=evt-1 outcome=Failed settlement=abandon 9 ms
2026-12-03 15:31:08,400 devservers.host process_order_event messageId=evt-2 outcome=Succeeded settlement=complete 9 ms
"""


def test_an_unplanned_dead_letter_is_traced_through_its_deliveries_and_a_planned_one_is_not() -> None:
    dead = [SimpleNamespace(message_id="evt-1", dead_letter_reason="MaxDeliveryCountExceeded",
                            dead_letter_error_description="Message could not be consumed after 10 delivery attempts."),
            SimpleNamespace(message_id="evt-2", dead_letter_reason="PayloadMismatch",
                            dead_letter_error_description="x")]
    seen = report.Observed(documents=[], dead_letters=dead, accepted=[], broker_accepted=0, reservations=[], logs=LOGS,
                           sent_at={}, elapsed=0.0, queues_left=0)
    traced = report._traced(seen, Counter({"MaxDeliveryCountExceeded": 1}))
    assert traced.startswith("; evt-1 MaxDeliveryCountExceeded: the app logged ['failed'], the hosts settled"
                             " ['abandon', 'abandon'], described 'Message could not be consumed")
    assert "evt-2" not in traced


def test_the_recovery_is_the_bursts_last_reservation_after_the_return_not_the_steady_phases() -> None:
    calls = [SimpleNamespace(time=t, status=status) for t, status in
             [(105.0, 503), (130.0, 201), (171.5, 200), (180.0, 503), (250.0, 201)]]  # 250: the steady phase's
    result = report.Report(figures={"outcomes": {"handed_on": 7}})
    result.add_outage("", calls, 100.0, 120.0, drained=200.0)
    outage = result.figures["outage"]
    assert outage["last reservation after the service came back, s"] == 51.5
    assert (outage["seconds"], outage["requests received while down"], outage["handed on"]) == (20, 1, 7)
