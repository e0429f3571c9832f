"""One log line per request the broker answers, at INFO on ``devservers.servicebus.requests``.

``python -m devservers.servicebus --verbose`` shows them: what was asked (attach, send, deliver,
settle, a ``$management`` operation, a ``$cbs`` token), on which entity, and the outcome. MessageIds
and sequence numbers are named; bodies and properties never are.
"""

from __future__ import annotations

import logging

from devservers.servicebus.store import StoredMessage

__all__ = ["attached", "cbs", "delivered", "management", "refused", "sent", "settled"]

log = logging.getLogger("devservers.servicebus.requests")


def attached(role: str, address: str, detail: str = "") -> None:
    """A client opened a sender or receiver link on an entity."""
    log.info("attach %s %s%s: open", role, address, f" ({detail})" if detail else "")


def refused(what: str, address: str, condition: str, description: str = "") -> None:
    """A request the broker answered with an error condition (and the error's description, if it helps)."""
    log.info("%s %s: refused %s%s", what, address, condition, f" ({description})" if description else "")


def sent(address: str, sequence_numbers: list[int]) -> None:
    """A transfer of one message or a batch; sequence number 0 marks a duplicate that was dropped."""
    dropped = sequence_numbers.count(0)
    accepted = len(sequence_numbers) - dropped
    log.info("send %s: %d accepted%s", address, accepted, f", {dropped} duplicate(s) dropped" if dropped else "")


def delivered(address: str, message: StoredMessage, *, peek_lock: bool) -> None:
    """A message handed to a receiver."""
    log.info("deliver %s #%d %s: %s", address, message.sequence_number, message.envelope.message_id or "-",
             "locked" if peek_lock else "removed (receive-and-delete)")


def settled(outcome: str, address: str, message: StoredMessage) -> None:
    """A receiver's settlement that was applied."""
    log.info("%s %s #%d %s: ok", outcome, address, message.sequence_number, message.envelope.message_id or "-")


def management(operation: str, address: str, status: int, description: str) -> None:
    """A ``$management`` request and its status."""
    log.info("%s %s: %d%s", operation.removeprefix("com.microsoft:"), address, status,
             f" {description}" if status >= 300 else "")


def cbs(audience: str, status: int) -> None:
    """A claims-based-security put-token (always accepted: this is a test peer)."""
    log.info("put-token %s: %d", audience, status)
