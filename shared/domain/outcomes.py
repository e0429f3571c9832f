"""What the core decided about one delivery. Settlement is mapped from it in one place (consumers)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Outcome(StrEnum):
    """The outcome of one delivery, as logged and counted. Values are stable: alerts rely on them."""

    CREATED = "created"
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    STALE = "stale"
    PAYLOAD_MISMATCH = "payload_mismatch"
    INVALID = "invalid"
    INVALID_TRANSITION = "invalid_transition"
    GAP = "gap"
    IN_PROGRESS = "in_progress"
    DOWNSTREAM_REJECTED = "downstream_rejected"
    OUT_OF_ORDER = "out_of_order"
    TRANSIENT = "transient"
    ERROR = "error"


@dataclass(frozen=True)
class Result:
    """An outcome with a description fit for a dead-letter record: ids, hashes and rules, no payload."""

    outcome: Outcome
    description: str = ""
    request_hash: str | None = None
