"""The delivery pump: messages into entities from senders, and out of them to receivers within their credit.

Deliveries to receivers carry 16-byte delivery tags that are the lock token's ``bytes_le`` (the SDK
reads the token as ``UUID(bytes_le=tag)``). proton's Python ``Delivery.tag`` decodes tags as UTF-8, so
the token is kept on the delivery as an attribute instead of being read back from the tag.

The SDK (7.15) sends settlements unsettled and waits for the broker to settle with the outcome it
applied; without that echo it retries through ``$management``. Every disposition is therefore
answered with a settled disposition: the same outcome, or ``rejected`` with the Service Bus error
(e.g. ``com.microsoft:message-lock-lost``) when it cannot be applied.
"""

from __future__ import annotations

import logging
import time
import uuid

from proton import Delivery, Disposition, Link

from devservers.servicebus import requestlog, wire
from devservers.servicebus.amqp import INCOMING_CREDIT, INTERNAL_ERROR, LinkInfo, condition, new_delivery
from devservers.servicebus.errors import BrokerError
from devservers.servicebus.routing import LinkRouter, LinkTable
from devservers.servicebus.store import Outcome, StoredMessage

__all__ = ["DeliveryPump"]

log = logging.getLogger("devservers.servicebus")

DECODE_ERROR = "amqp:decode-error"


class DeliveryPump:
    """Stores what clients send, delivers to receivers as far as their credit goes, and applies their settlements."""

    def __init__(self, table: LinkTable, router: LinkRouter) -> None:
        self._table = table
        self._router = router

    # -- into entities ------------------------------------------------------------------------

    def take(self, link: Link, delivery: Delivery) -> bytes | None:
        """The bytes of a complete incoming transfer (None while partial, or if aborted); keeps credit topped up."""
        if delivery.aborted:
            delivery.settle()
            return None
        if delivery.partial:
            return None  # wait for the last frame; proton buffers the rest
        data = link.recv(delivery.pending) or b""
        link.advance()
        if link.credit < INCOMING_CREDIT // 2:
            link.flow(INCOMING_CREDIT - link.credit)
        return data

    def store(self, delivery: Delivery, info: LinkInfo, data: bytes) -> None:
        """Enqueue a message (or a batch) sent on a send link; a refusal rejects the transfer with the reason.

        The size checked is the whole transfer, as Service Bus counts it: for a batch, every message in it
        and the batch's own envelope.
        """
        assert info.target is not None
        intake = info.target.intake
        try:
            intake.check_size(len(data))
            parsed = wire.parse_message(data)
            batch = wire.unpack_batch(parsed)
            if batch is not None:
                intake.check_size(len(data), batch=True)
            messages = batch if batch is not None else [parsed]
            numbers = intake.send([wire.envelope_of(m) for m in messages], time.time())
        except wire.DecodeError as err:
            requestlog.refused("send", info.address, DECODE_ERROR)
            _reject(delivery, DECODE_ERROR, str(err))
        except BrokerError as err:
            requestlog.refused("send", info.address, err.condition)
            _reject(delivery, err.condition, err.description)
        except Exception:
            log.exception("failed to store a message sent to %s", info.address)
            requestlog.refused("send", info.address, INTERNAL_ERROR)
            _reject(delivery, INTERNAL_ERROR, "The broker failed to store the message.")
        else:
            requestlog.sent(info.address, numbers)
            if not delivery.settled:  # i.e. not pre-settled by the client
                delivery.update(Disposition.ACCEPTED)
            delivery.settle()

    # -- out to receivers ---------------------------------------------------------------------

    def run(self) -> None:
        """Deliver available messages to every receiver with credit (and hand out waiting sessions)."""
        now = time.time()
        # The entities that had no session to give in this run: their other waiting links are not asked again, since
        # nothing in a run makes a session available (each ask reads every session of the entity; with a few hosts'
        # session slots waiting, asking each made the broker's busiest path).
        none_left: set[int] = set()
        for link, info in self._table.receivers():
            self._deliver(link, info, now, none_left)

    def fill(self, link: Link, info: LinkInfo) -> None:
        """Deliver to one receiver within its credit: what its flow asks for. A flow makes nothing deliverable to any
        other receiver, and a receiver still waiting for a session is given one by ``run``, on what makes one
        available. (A pass over every receiver on each flow cost the broker in proportion to the square of the
        receivers: each idle receive loop of the local host flows every 2 s, and a few hosts hold a hundred
        receivers.)"""
        if info.session_wait_deadline is None:
            self._deliver(link, info, time.time(), set())

    def _deliver(self, link: Link, info: LinkInfo, now: float, none_left: set[int]) -> None:
        """One receiver's part of a pass: the session it waits for, if one is there, then messages within its credit;
        a receiver whose delivery fails is closed with the reason."""
        if info.closed or info.entity is None:
            return
        try:
            if info.session_wait_deadline is not None:
                if id(info.entity) in none_left:
                    return
                info.session = info.entity.sessions.accept(None, info, now)
                if info.session is None:
                    none_left.add(id(info.entity))
                    return
                self._router.open_session_link(link, info)
            self._fill(link, info, now)
        except Exception:
            log.exception("failed to deliver to %s", info.address)
            self._router.close(link, info, INTERNAL_ERROR, "The broker failed to deliver a message.")

    def settle(self, delivery: Delivery, info: LinkInfo) -> None:
        """The client settled a delivery we sent: apply it, then echo the outcome, settled."""
        token = getattr(delivery, "sb_token", None)
        state = delivery.remote_state
        if not isinstance(token, uuid.UUID) or info.entity is None or not state:
            if delivery.settled:  # settled by the client without an outcome we act on
                delivery.settle()
            return
        if getattr(delivery, "sb_done", False):
            return
        delivery.sb_done = True
        outcome, reason, description = _outcome_of(delivery)
        try:
            message = info.entity.settle(
                token, outcome, time.time(), dead_letter_reason=reason, dead_letter_description=description
            )
        except BrokerError as err:
            requestlog.refused(outcome.value, info.address, err.condition)
            delivery.local.condition = condition(err.condition, err.description)
            delivery.update(Disposition.REJECTED)
        else:
            requestlog.settled(outcome.value, info.address, message)
            if state == Disposition.MODIFIED:
                delivery.local.failed = delivery.remote.failed
                delivery.local.undeliverable = delivery.remote.undeliverable
            delivery.update(state)
        delivery.settle()

    def _fill(self, link: Link, info: LinkInfo, now: float) -> None:
        assert info.entity is not None
        while link.credit > 0:
            message = info.entity.next_message(info, now, peek_lock=info.peek_lock, session=info.session)
            if message is None:
                break
            _send(link, message)
            requestlog.delivered(info.address, message, peek_lock=info.peek_lock)
        if link.drain_mode:
            link.drained()  # nothing left to send: give the rest of the credit back, as drain asks


def _send(link: Link, message: StoredMessage) -> None:
    token = message.lock_token
    tag = token.bytes_le if token is not None else uuid.uuid4().bytes_le
    delivery = new_delivery(link, tag)
    if token is not None:
        delivery.sb_token = token
    link.send(wire.encode_delivery(message, delivering=True, locked_until=message.locked_until))
    link.advance()
    if token is None:
        delivery.settle()  # ReceiveAndDelete: the message is gone already


def _reject(delivery: Delivery, condition_name: str, description: str) -> None:
    delivery.local.condition = condition(condition_name, description)
    delivery.update(Disposition.REJECTED)
    delivery.settle()


def _outcome_of(delivery: Delivery) -> tuple[Outcome, str | None, str | None]:
    """Map the client's AMQP outcome to a Service Bus settlement (see the SDK's settle_message_via_receiver_link).

    accepted = complete; rejected (condition ``com.microsoft:dead-letter``) = dead-letter, with the reason
    and description in the error's info; modified with undeliverable-here = defer, with delivery-failed
    only = abandon; released (or modified with neither flag) = give back without counting a delivery.
    """
    state = delivery.remote_state
    if state == Disposition.ACCEPTED:
        return Outcome.COMPLETE, None, None
    if state == Disposition.REJECTED:
        error = delivery.remote.condition
        info = dict(error.info or {}) if error is not None and isinstance(error.info, dict) else {}
        reason = info.get("DeadLetterReason")
        description = info.get("DeadLetterErrorDescription")
        if description is None and error is not None:
            description = error.description
        return (
            Outcome.DEAD_LETTER,
            None if reason is None else str(reason),
            None if description is None else str(description),
        )
    if state == Disposition.MODIFIED:
        if delivery.remote.undeliverable:
            return Outcome.DEFER, None, None
        if delivery.remote.failed:
            return Outcome.ABANDON, None, None
    return Outcome.RELEASE, None, None
