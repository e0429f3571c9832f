"""What counts as work left undone is one rule, read by the simulator's invariants and the demo's report.

They disagreed on parked events: the simulator called any parked-event document stuck, the demo only one
still parked. An event rejected on release, or dropped by an operator, is a final record kept with its
reason (README: "kept, rejected"; sbctl parked drop), and nothing will act on it again; report_stuck and
ParkedEvent.waiting count status parked only. That is the rule both now read.
"""

from __future__ import annotations

import msgspec
import pytest

from demo.report import Observed, build
from demo.scenario import Scenario
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ports.store import Document
from idempotent_consumer.records import ParkedEvent, ParkedStatus
from shared.domain.lifecycle import ORDER_SHIPPED, parse_event
from simulation.invariants import left_undone
from tests.support.events import encode_event, event_body


def parked(status: ParkedStatus) -> Document:
    """A stored parked-event document, as the store returns it, with ``status``."""
    body = event_body("ord-1", 3, ORDER_SHIPPED)
    event = parse_event(InboundMessage(message_id=body["id"], body=encode_event(body), session_id="ord-1"))
    document = ParkedEvent.of(event, consumer="order-projection", message_id=body["id"], request_hash="h" * 64,
                              now=1_796_083_200.0)
    reason = None if status is ParkedStatus.PARKED else "set aside"
    stored: Document = msgspec.to_builtins(msgspec.structs.replace(document, status=status, reason=reason))
    return {**stored, "_etag": '"1"', "_ts": 1}


def demo_in_flight(document: Document) -> list[str]:
    """The demo report's violations over an empty plan and this one document."""
    seen = Observed(documents=[document], dead_letters=[], accepted=[], broker_accepted=0, reservations=[],
                    logs="", sent_at={}, elapsed=1.0, queues_left=0)
    return build(Scenario(), seen).violations


def test_an_event_still_parked_is_left_undone_for_both() -> None:
    document = parked(ParkedStatus.PARKED)
    assert left_undone(document) == f"event v3 {document['eventId']} of ord-1 is still parked"
    [violation] = demo_in_flight(document)
    assert violation.startswith("1 documents and 0 messages still in flight; event v3")


@pytest.mark.parametrize("status", [ParkedStatus.REJECTED, ParkedStatus.DROPPED])
def test_an_event_set_aside_for_good_is_a_final_record_for_both(status: ParkedStatus) -> None:
    document = parked(status)
    assert left_undone(document) is None  # the simulator called this one stuck
    assert demo_in_flight(document) == []
