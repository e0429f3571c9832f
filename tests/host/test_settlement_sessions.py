"""The host's Settlement service finds a session through its current holder: after a session was let go under
a running invocation, the old delivery's receiver is closed, and another receiver holds the session now."""

from __future__ import annotations

import threading
import types
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from devservers.host.settlement import Deliveries, Delivery, LiveDeliveries, Refused


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
