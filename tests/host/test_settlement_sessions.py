"""The host's Settlement service finds a session through its current holder: after a session was let go under
a running invocation, the old delivery's receiver is closed, and another receiver holds the session now."""

from __future__ import annotations

import threading
import types
import uuid
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest
from azure.servicebus._pyamqp._decode import decode_payload
from azure.servicebus._pyamqp.message import Header, Message, Properties

from devservers.host.servicebus import binding_data
from devservers.host.settlement import RELEASE_REQUESTED, Deliveries, Delivery, LiveDeliveries, Refused


class Session:
    def __init__(self, session_id: str, *, fails: bool = False) -> None:
        self.session_id, self.fails, self.renewed = session_id, fails, 0
        self.locked_until_utc = datetime(2026, 12, 2, tzinfo=UTC)

    def renew_lock(self) -> None:
        if self.fails:
            raise ValueError("the handler has been shut down")
        self.renewed += 1


def delivery(session: Session, *, closed: bool) -> Delivery:
    shutdown = threading.Event()
    if closed:
        shutdown.set()
    receiver: Any = types.SimpleNamespace(session=session, _shutdown=shutdown)
    message: Any = types.SimpleNamespace(message_id="m-1", lock_token=str(uuid.uuid4()))
    return Delivery(receiver, message)


def test_a_renewal_goes_to_the_newest_open_holder_of_the_session() -> None:
    deliveries = Deliveries()
    old, new = Session("ord-1", fails=True), Session("ord-1")
    deliveries.register(delivery(old, closed=True))  # let go under its invocation, which still runs
    deliveries.register(delivery(new, closed=False))
    LiveDeliveries(deliveries).renew_session_lock("ord-1")
    assert (old.renewed, new.renewed) == (0, 1)


def test_a_renewal_the_sdk_refuses_is_answered_as_refused_not_as_an_unknown_error() -> None:
    deliveries = Deliveries()
    deliveries.register(delivery(Session("ord-1", fails=True), closed=False))
    with pytest.raises(Refused, match="renewing the lock of session ord-1 failed"):
        LiveDeliveries(deliveries).renew_session_lock("ord-1")


def test_a_session_held_only_by_a_closed_receiver_is_not_found() -> None:
    deliveries = Deliveries()
    deliveries.register(delivery(Session("ord-1"), closed=True))
    with pytest.raises(Refused, match="Session ord-1 not found"):
        LiveDeliveries(deliveries).renew_session_lock("ord-1")


def test_release_session_marks_the_holder_so_its_slot_takes_no_next_message_and_an_unheld_one_is_refused() -> None:
    deliveries = Deliveries()
    held = delivery(Session("ord-1"), closed=False)
    other = delivery(Session("ord-2"), closed=False)
    deliveries.register(held)
    deliveries.register(other)
    LiveDeliveries(deliveries).release_session("ord-1")
    assert getattr(held.receiver, RELEASE_REQUESTED, False) is True
    assert getattr(other.receiver, RELEASE_REQUESTED, False) is False
    with pytest.raises(Refused, match="Session ord-3 not found") as refused:
        LiveDeliveries(deliveries).release_session("ord-3")
    assert refused.value.code is grpc.StatusCode.FAILED_PRECONDITION


def test_the_binding_bytes_carry_the_delivery_count_the_extension_writes_one_more_than_the_wire() -> None:
    # The extension hands the worker the .NET message's AMQP bytes, whose header counts from 1 (the broker's 0 + 1).
    token = uuid.uuid4()
    for wire, expected in ((0, 1), (3, 4), (None, 1)):
        header = None if wire is None else Header(delivery_count=wire)
        message = Message(data=[b"{}"], header=header, properties=Properties(message_id="m-1"))
        content = binding_data(token, message).content
        decoded = decode_payload(memoryview(content[16:]))
        assert decoded.header is not None and decoded.header.delivery_count == expected, wire
