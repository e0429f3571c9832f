"""The host's Settlement service: the worker's ServiceBusMessageActions calls land here, on the same port.

A message can be settled only while its invocation runs: the listener registers the delivery before
it invokes the function and unregisters it afterwards, and a call for a lock token not registered
fails with FAILED_PRECONDITION "LockToken ... not found", as the host answers. Each call is carried
out with the azure-servicebus receiver that received the message; an SDK failure (typically a lost
lock) goes back to the worker as an error, so its settle call raises.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

import grpc
from azure.servicebus import ServiceBusReceivedMessage, ServiceBusReceiver
from azure.servicebus.exceptions import ServiceBusError
from azurefunctions.extensions.bindings.protos import settlement_pb2 as pb
from azurefunctions.extensions.bindings.protos import settlement_pb2_grpc as pb_grpc
from google.protobuf.empty_pb2 import Empty
from google.protobuf.timestamp_pb2 import Timestamp


@dataclass
class Delivery:
    """A message handed to a function, the receiver that holds its lock, and how it was settled."""

    receiver: ServiceBusReceiver
    message: ServiceBusReceivedMessage
    settled: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def settle(self, action: str, **kwargs: Any) -> None:
        """Carry out one settlement once; a second raises, as a settled lock token is gone."""
        with self.lock:
            if self.settled is not None:
                raise ValueError(f"the message was already settled ({self.settled})")
            getattr(self.receiver, f"{action}_message")(self.message, **kwargs)
            self.settled = action


class Deliveries:
    """The deliveries whose invocations are running, by lock token."""

    def __init__(self) -> None:
        self._live: dict[str, Delivery] = {}
        self._lock = threading.Lock()

    def register(self, delivery: Delivery) -> str:
        """Make a delivery settleable; returns its lock token."""
        token = str(delivery.message.lock_token)
        with self._lock:
            self._live[token] = delivery
        return token

    def unregister(self, token: str) -> None:
        """The invocation has ended: settle calls for this token now fail."""
        with self._lock:
            self._live.pop(token, None)

    def find(self, token: str) -> Delivery | None:
        """The live delivery for a lock token."""
        with self._lock:
            return self._live.get(token)

    def sessions(self) -> list[Delivery]:
        """The live deliveries that came from a session receiver."""
        with self._lock:
            return [d for d in self._live.values() if d.receiver.session is not None]

    def count(self) -> int:
        """How many invocations with a message are running."""
        with self._lock:
            return len(self._live)


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    context.abort(code, details)
    raise AssertionError("context.abort returns by raising")  # pragma: no cover


class SettlementService(pb_grpc.SettlementServicer):  # type: ignore[misc]
    """Complete, abandon, dead-letter, defer and renew, over the live deliveries."""

    def __init__(self, deliveries: Deliveries) -> None:
        self._deliveries = deliveries

    def _settle(self, token: str, context: grpc.ServicerContext, action: str, **kwargs: Any) -> Empty:
        delivery = self._deliveries.find(token)
        if delivery is None:
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, f"LockToken {token} not found.")
        try:
            delivery.settle(action, **kwargs)
        except (ServiceBusError, ValueError) as exc:
            _abort(context, grpc.StatusCode.UNKNOWN, f"{action} of LockToken {token} failed: {exc}")
        return Empty()

    def Complete(self, request: Any, context: grpc.ServicerContext) -> Empty:
        """Complete the message."""
        return self._settle(request.locktoken, context, "complete")

    def Abandon(self, request: Any, context: grpc.ServicerContext) -> Empty:
        """Abandon the message: available again at once."""
        return self._settle(request.locktoken, context, "abandon")

    def Deadletter(self, request: Any, context: grpc.ServicerContext) -> Empty:
        """Dead-letter the message with its reason and description."""
        reason = request.deadletterReason.value if request.HasField("deadletterReason") else None
        description = (request.deadletterErrorDescription.value
                       if request.HasField("deadletterErrorDescription") else None)
        return self._settle(request.locktoken, context, "dead_letter", reason=reason, error_description=description)

    def Defer(self, request: Any, context: grpc.ServicerContext) -> Empty:
        """Defer the message."""
        return self._settle(request.locktoken, context, "defer")

    def RenewMessageLock(self, request: Any, context: grpc.ServicerContext) -> Empty:
        """Renew the message's lock (the host renews it anyway while the function runs)."""
        delivery = self._deliveries.find(request.locktoken)
        if delivery is None:
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, f"LockToken {request.locktoken} not found.")
        try:
            delivery.receiver.renew_message_lock(delivery.message)
        except ServiceBusError as exc:
            _abort(context, grpc.StatusCode.UNKNOWN, f"renewing LockToken {request.locktoken} failed: {exc}")
        return Empty()

    def _session(self, session_id: str, context: grpc.ServicerContext) -> Any:
        for delivery in self._deliveries.sessions():
            if delivery.receiver.session.session_id == session_id:
                return delivery.receiver.session
        _abort(context, grpc.StatusCode.FAILED_PRECONDITION, f"Session {session_id} not found.")

    def GetSessionState(self, request: Any, context: grpc.ServicerContext) -> Any:
        """The session's state."""
        state = self._session(request.sessionId, context).get_state()
        return pb.GetSessionStateResponse(sessionState=state or b"")

    def SetSessionState(self, request: Any, context: grpc.ServicerContext) -> Empty:
        """Set the session's state."""
        self._session(request.sessionId, context).set_state(request.sessionState)
        return Empty()

    def ReleaseSession(self, request: Any, context: grpc.ServicerContext) -> Empty:
        """Release the session after this invocation (the listener closes its receiver)."""
        self._session(request.sessionId, context)
        return Empty()

    def RenewSessionLock(self, request: Any, context: grpc.ServicerContext) -> Any:
        """Renew the session lock; answers when it now ends."""
        session = self._session(request.sessionId, context)
        session.renew_lock()
        locked_until = Timestamp()
        locked_until.FromDatetime(session.locked_until_utc or datetime.now(UTC) + timedelta(minutes=1))
        return pb.RenewSessionLockResponse(lockedUntil=locked_until)


def add_settlement(server: grpc.Server, deliveries: Deliveries) -> None:
    """Serve Settlement on ``server``, beside the FunctionRpc EventStream."""
    pb_grpc.add_SettlementServicer_to_server(SettlementService(deliveries), server)
