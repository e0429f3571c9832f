"""The order app's ids: the library's (``idempotent_consumer.identity``) under the order app's names.

Pinned like the library's (``tests/unit/test_identity.py``): once a document or a message carries one, its
formula can never change without a migration. The outcome of an order is one outgoing entry per order, under
the name ``OrderAccepted`` whichever outcome it holds, so that an order holds one or the other, never both;
each outcome's message is named after it.
"""

from __future__ import annotations

from idempotent_consumer.identity import derive_id, outgoing_entry_id, outgoing_message_id

ORDER_ACCEPTED = "OrderAccepted"
ORDER_REJECTED = "OrderRejected"


def outbox_id(consumer: str, order_id: str) -> str:
    """The id of an order's outcome entry in the outbox: its OrderAccepted or its OrderRejected, one id for both,
    so that an order can hold one of them only (it is derived from OrderAccepted's name, as it was before
    OrderRejected existed)."""
    return outgoing_entry_id(consumer, ORDER_ACCEPTED, order_id)


def outbox_message_id(consumer: str, order_id: str) -> str:
    """The MessageId OrderAccepted is sent with."""
    return outgoing_message_id(consumer, ORDER_ACCEPTED, order_id)


def rejected_correction_id(consumer: str, order_id: str) -> str:
    """The id of the OrderRejected entry of an order the version before announced accepted at its intake, before
    the service refused its reservation: a correction beside that entry, under an id of its own."""
    return outgoing_entry_id(consumer, ORDER_REJECTED, order_id)


def rejected_message_id(consumer: str, order_id: str) -> str:
    """The MessageId OrderRejected is sent with."""
    return outgoing_message_id(consumer, ORDER_REJECTED, order_id)


def event_record_id(record_type: str, source: str, event_id: str, label: str) -> str:
    """The id of what an applied event recorded (payment, shipment, cancellation)."""
    return derive_id(record_type, source, event_id, label=label)
