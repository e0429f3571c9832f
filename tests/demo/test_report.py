"""The report's trace of a dead letter the plan did not expect, and its recovery from the outage."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from types import SimpleNamespace

from demo import report
from idempotent_consumer import retries

COPY = "retry.6_ord-1." + "ab" * 32
LOGS = f"""\
2026-12-03 15:31:07,348 devservers.host worker [9a39c97d] idempotent_consumer: delivery process_order_event \
messageId=evt-1 outcome=failed latencyMs=12.5 deliveryCount=None durationMs=7.2
2026-12-03 15:31:07,373 devservers.host process_order_event messageId=evt-1 outcome=Failed settlement=abandon 9 ms
2026-12-03 15:31:08,373 devservers.host process_order_event messageId=evt-1 outcome=Failed settlement=abandon 9 ms
2026-12-03 15:31:08,400 devservers.host process_order_event messageId=evt-2 outcome=Succeeded settlement=complete 9 ms
2026-12-03 15:31:09,100 devservers.host worker [9a39c97d] idempotent_consumer: delivery process_order \
messageId=ord-1 outcome=transient latencyMs=2.0 deliveryCount=None durationMs=1.0 retryAttempt=5 detail=not this one
2026-12-03 15:31:10,100 devservers.host worker [9a39c97d] idempotent_consumer: delivery process_order \
messageId=ord-1 outcome=transient latencyMs=2.0 deliveryCount=None durationMs=1.0 retryAttempt=6 detail=HTTP 503
2026-12-03 15:31:10,120 devservers.host process_order messageId={COPY} outcome=Succeeded settlement=abandon 1020 ms
2026-12-03 15:31:17,000 devservers.host process_order messageId={COPY} outcome=Failed settlement=abandon failed 6500 ms
2026-12-03 15:31:18,000 devservers.host process_order messageId={COPY} outcome=Failed settlement=abandon (host) 300 ms
2026-12-03 15:31:09,500 devservers.host worker [1b2c3d4e] idempotent_consumer: delivery process_order \
messageId=ord-1 outcome=handed_on latencyMs=2.0 deliveryCount=None durationMs=1.0 retryAttempt=6 detail=another host
"""  # the last line another host's, earlier: the stack's logs are each host's in turn


def _dead(message_id: str, reason: str, description: str = "x", properties: dict[bytes, bytes] | None = None) \
        -> SimpleNamespace:
    return SimpleNamespace(message_id=message_id, dead_letter_reason=reason, dead_letter_error_description=description,
                           application_properties=properties)


def test_an_unplanned_dead_letter_is_traced_through_its_deliveries_and_a_planned_one_is_not() -> None:
    dead = [_dead("evt-1", "MaxDeliveryCountExceeded", "Message could not be consumed after 10 delivery attempts."),
            _dead("evt-2", "PayloadMismatch")]
    seen = report.Observed(documents=[], dead_letters=dead, accepted=[], broker_accepted=0, reservations=[], logs=LOGS,
                           sent_at={}, elapsed=0.0, queues_left=0)
    traced = report._traced(seen, Counter({"MaxDeliveryCountExceeded": 1}))
    assert traced.startswith("; evt-1 MaxDeliveryCountExceeded: the app logged ['failed'] (the last at 15:31:07,348:"
                             " ''), the hosts ran ['15:31:07,373 Failed abandon 9 ms', '15:31:08,373 Failed"
                             " abandon 9 ms'], described 'Message could not be consumed")
    assert "evt-2" not in traced


def test_a_copys_trace_reads_the_app_under_its_original_and_attempt_and_tells_who_settled_how() -> None:
    chain = retries.copy_properties(retries.Chain("ord-1", "77", 5, datetime(2026, 12, 3, tzinfo=UTC)), "HTTP 503")
    copy = _dead(COPY, "MaxDeliveryCountExceeded", properties={k.encode(): v.encode() for k, v in chain.items()})
    seen = report.Observed(documents=[], dead_letters=[copy], accepted=[],
                           broker_accepted=0, reservations=[], logs=LOGS, sent_at={}, elapsed=0.0, queues_left=0)
    traced = report._traced(seen, Counter({"MaxDeliveryCountExceeded": 1}))
    assert f"; {COPY} MaxDeliveryCountExceeded: the app logged ['handed_on', 'transient'] (the last at 15:31:10,100:" \
        " 'HTTP 503')" in traced
    assert ("the hosts ran ['15:31:10,120 Succeeded abandon 1020 ms', '15:31:17,000 Failed abandon failed 6500 ms',"
            " '15:31:18,000 Failed abandon (host) 300 ms']") in traced


def test_the_recovery_is_the_bursts_last_reservation_after_the_return_not_the_steady_phases() -> None:
    calls = [SimpleNamespace(time=t, status=status) for t, status in
             [(105.0, 503), (130.0, 201), (171.5, 200), (180.0, 503), (250.0, 201)]]  # 250: the steady phase's
    result = report.Report(figures={"outcomes": {"handed_on": 7}})
    result.add_outage("", calls, 100.0, 120.0, drained=200.0)
    outage = result.figures["outage"]
    assert outage["last reservation after the service came back, s"] == 51.5
    assert (outage["seconds"], outage["requests received while down"], outage["handed on"]) == (20, 1, 7)


NO_OUTAGE = report.Outages()


def _announced_twice(first_at: float, resent_at: float, resent_id: str = "acc-1",
                     outages: report.Outages = NO_OUTAGE) -> tuple[list[str], list[str]]:
    """The outcome check on one order, reserved once and its OrderAccepted received twice: its violations, and the
    copies ``outages`` explained."""
    scenario = SimpleNamespace(orders={"o-1": {}}, rejected=set())
    accepted = [{"orderId": "o-1", report.ACCEPTED_AS: ["acc-1", first_at]},
                {"orderId": "o-1", report.ACCEPTED_AS: [resent_id, resent_at]}]
    seen = report.Observed(documents=[], dead_letters=[], accepted=accepted, broker_accepted=0,
                           reservations=[{"orderId": "o-1"}], logs="", sent_at={}, elapsed=0.0, queues_left=0)
    resent: list[str] = []
    found = report._outcomes(scenario, seen, {"side-effect": [], "order": []}, outages, resent)  # type: ignore[arg-type]
    return found, resent


def test_an_outcome_resent_after_the_cosmos_outage_its_delete_met_is_counted_and_any_other_second_copy_is_not() -> None:
    outage = report.Outages([(105.0, 225.0)], window=10.0)
    assert _announced_twice(100.0, 300.0, outages=outage) == ([], ["acc-1"])  # sent 5 s before it began, resent after
    assert _announced_twice(110.0, 240.0, outages=outage) == ([], ["acc-1"])  # sent while it lasted
    for unexplained in (_announced_twice(100.0, 300.0),  # no outage: the 503 regression of 27c0eb8 looked like this
                        _announced_twice(90.0, 300.0, outages=outage),  # sent 15 s before: its delete had gone
                        _announced_twice(100.0, 200.0, outages=outage),  # resent while Cosmos DB was still down
                        _announced_twice(100.0, 300.0, "acc-2", outages=outage)):  # under another MessageId
        found, resent = unexplained
        assert resent == []
        assert len(found) == 1
        assert found[0].startswith("order o-1: 1 reservations, 2 OrderAccepted and 0 OrderRejected messages, not 1, 1")
