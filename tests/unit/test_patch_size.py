"""An order's changes fit in one Cosmos DB patch, with room for the fields a next version adds.

Park, release and the operator's commands write an order's changes as one patch on its etag
(``ordered.writes.subject_write``), and Cosmos DB takes at most ``MAX_PATCH_FIELDS`` operations in one patch;
``check_batch`` refuses more before sending, which a delivery would meet as an error on every retry.
The most an order changes at once is a release that applies an event of every kind and recounts what
is parked.
"""

from __future__ import annotations

from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ports.store import MAX_PATCH_FIELDS
from shared.domain.aggregate import order as order_state
from shared.domain.lifecycle import KINDS, parse_event
from tests.support.events import encode_event, event_body

NEXT_VERSION_FIELDS = 2  # what the chaos suite's next version adds to each order patch (riskScore, schemaVersion)


def test_an_order_changed_by_an_event_of_every_kind_fits_one_patch_with_room_for_a_next_version() -> None:
    order = order_state("ord-1", "placed", 1)
    for sequence, event_type in enumerate(KINDS, start=2):
        body = event_body("ord-1", sequence, event_type)
        event = parse_event(InboundMessage(message_id=body["id"], body=encode_event(body), session_id="ord-1"))
        order = order.apply(event)
    order = order.count_parked(3)
    records = {kind.record_type for kind in KINDS.values()}
    assert set(order.changes) == {"status", "version", "updatedAt", "parked", *records}
    assert len(order.changes) + NEXT_VERSION_FIELDS <= MAX_PATCH_FIELDS, sorted(order.changes)
