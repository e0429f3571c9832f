"""The applied events' records in a set of documents, wherever they stand."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from shared.domain.documents import event_records

EVENT_KINDS = ("payment", "shipment", "cancellation")


def recorded(documents: Iterable[Mapping[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The records of the applied events of ``kind`` (``payment``, ``shipment``, ``cancellation``): each order's
    sub-object of that name where it carries an event's identity, and any record document of that type (which a
    release before the sub-object held the identity wrote)."""
    return [dict(record) for found, record in event_records(documents) if found == kind]
