"""The host's Settlement service: the worker's ServiceBusMessageActions calls land here, on the same port.

A message can be settled only while its invocation runs: the listener registers the delivery before
it invokes the function and unregisters it afterwards, and a call for a lock token not registered
fails with FAILED_PRECONDITION "LockToken ... not found", as the host answers. Each call is carried
out with the azure-servicebus receiver that received the message; an SDK failure (typically a lost
lock) goes back to the worker as an error, so its settle call raises. A dead-letter reason or description
over 4,096 characters is refused before the broker is asked, as the .NET SDK refuses it, and the message
stays locked and unsettled.

``SettlementService`` reads the requests and answers; what carries each call out is a backend:
``LiveDeliveries`` here, a recording one in the tests' fake host, which serves this same service.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

import grpc
from azure.servicebus import ServiceBusReceivedMessage, ServiceBusReceiver
from azure.servicebus.exceptions import ServiceBusError
from azurefunctions.extensions.bindings.protos import settlement_pb2 as pb
from azurefunctions.extensions.bindings.protos import settlement_pb2_grpc as pb_grpc
from google.protobuf.empty_pb2 import Empty
from google.protobuf.timestamp_pb2 import Timestamp

_Answer = TypeVar("_Answer")
# Azure.Messaging.ServiceBus: Constants.MaxDeadLetterReasonLength, which AmqpReceiver.DeadLetterInternalAsync checks
# deadLetterReason and deadLetterErrorDescription against (Argument.AssertNotTooLong) before any network call.
MAX_DEAD_LETTER_REASON_LENGTH = 4096


# Set on a session receiver whose session a function released: its slot takes no next message from it.
RELEASE_REQUESTED = "_host_release_requested"


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
        """The live deliveries that came from a session receiver, oldest first."""
        with self._lock:
            return [d for d in self._live.values() if d.receiver.session is not None]

    def count(self) -> int:
        """How many invocations with a message are running."""
        with self._lock:
            return len(self._live)


class Refused(Exception):
    """A settlement call the host answers with an error status: ``code`` and ``details`` go back to the worker."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class SettlementBackend(Protocol):
    """What carries out each Settlement call; a refused call raises Refused.

    The host's is ``LiveDeliveries``, over the receivers of the invocations running; the tests' fake host
    (tests/support/fake_host.py) has one that records each call. The gRPC side is ``SettlementService``.
    """

    def complete(self, token: str) -> None:
        """Complete the message."""

    def abandon(self, token: str, properties_to_modify: bytes) -> None:
        """Abandon the message: available again at once."""

    def deadletter(self, token: str, reason: str | None, description: str | None, properties_to_modify: bytes) -> None:
        """Dead-letter the message with its reason and description (None when the worker left them unset)."""

    def defer(self, token: str, properties_to_modify: bytes) -> None:
        """Defer the message."""

    def renew_message_lock(self, token: str) -> None:
        """Renew the message's lock."""

    def get_session_state(self, session_id: str) -> bytes:
        """The session's state (empty when unset)."""

    def set_session_state(self, session_id: str, state: bytes) -> None:
        """Set the session's state."""

    def release_session(self, session_id: str) -> None:
        """Release the session after this invocation."""

    def renew_session_lock(self, session_id: str) -> datetime:
        """Renew the session lock; when it now ends."""


class SettlementService(pb_grpc.SettlementServicer):  # type: ignore[misc]
    """The host's Settlement gRPC service: reads each request and answers as the host does, carried out by a backend."""

    def __init__(self, backend: SettlementBackend) -> None:
        self._backend = backend

    def _answer(self, context: grpc.ServicerContext, call: Callable[..., _Answer], *args: Any) -> _Answer:
        try:
            return call(*args)
        except Refused as refused:
            context.abort(refused.code, refused.details)
            raise AssertionError("context.abort returns by raising") from None  # pragma: no cover

    def Complete(self, request: Any, context: grpc.ServicerContext) -> Empty:
        """Complete the message."""
        self._answer(context, self._backend.complete, request.locktoken)
        return Empty()

    def Abandon(self, request: Any, context: grpc.ServicerContext) -> Empty:
        """Abandon the message: available again at once."""
        self._answer(context, self._backend.abandon, request.locktoken, request.propertiesToModify)
        return Empty()

    def Deadletter(self, request: Any, context: grpc.ServicerContext) -> Empty:
        """Dead-letter the message with its reason and description."""
        reason = request.deadletterReason.value if request.HasField("deadletterReason") else None
        description = (request.deadletterErrorDescription.value
                       if request.HasField("deadletterErrorDescription") else None)
        self._answer(context, self._backend.deadletter, request.locktoken, reason, description,
                     request.propertiesToModify)
        return Empty()

    def Defer(self, request: Any, context: grpc.ServicerContext) -> Empty:
        """Defer the message."""
        self._answer(context, self._backend.defer, request.locktoken, request.propertiesToModify)
        return Empty()

    def RenewMessageLock(self, request: Any, context: grpc.ServicerContext) -> Empty:
        """Renew the message's lock (the host renews it anyway while the function runs)."""
        self._answer(context, self._backend.renew_message_lock, request.locktoken)
        return Empty()

    def GetSessionState(self, request: Any, context: grpc.ServicerContext) -> Any:
        """The session's state."""
        state = self._answer(context, self._backend.get_session_state, request.sessionId)
        return pb.GetSessionStateResponse(sessionState=state)

    def SetSessionState(self, request: Any, context: grpc.ServicerContext) -> Empty:
        """Set the session's state."""
        self._answer(context, self._backend.set_session_state, request.sessionId, request.sessionState)
        return Empty()

    def ReleaseSession(self, request: Any, context: grpc.ServicerContext) -> Empty:
        """Release the session after this invocation (the listener closes its receiver)."""
        self._answer(context, self._backend.release_session, request.sessionId)
        return Empty()

    def RenewSessionLock(self, request: Any, context: grpc.ServicerContext) -> Any:
        """Renew the session lock; answers when it now ends."""
        locked_until = Timestamp()
        locked_until.FromDatetime(self._answer(context, self._backend.renew_session_lock, request.sessionId))
        return pb.RenewSessionLockResponse(lockedUntil=locked_until)


class LiveDeliveries:
    """The host's backend: each call carried out with the receiver of a delivery whose invocation is running."""

    def __init__(self, deliveries: Deliveries) -> None:
        self._deliveries = deliveries

    def _find(self, token: str) -> Delivery:
        delivery = self._deliveries.find(token)
        if delivery is None:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"LockToken {token} not found.")
        return delivery

    def _settle(self, token: str, action: str, **kwargs: Any) -> None:
        try:
            self._find(token).settle(action, **kwargs)
        except (ServiceBusError, ValueError) as exc:
            raise Refused(grpc.StatusCode.UNKNOWN, f"{action} of LockToken {token} failed: {exc}") from exc

    def complete(self, token: str) -> None:
        """Complete the message."""
        self._settle(token, "complete")

    def abandon(self, token: str, properties_to_modify: bytes) -> None:
        """Abandon the message."""
        self._settle(token, "abandon")

    def deadletter(self, token: str, reason: str | None, description: str | None, properties_to_modify: bytes) -> None:
        """Dead-letter the message; a reason or description over 4,096 characters is refused, the message untouched."""
        self._find(token)  # an unknown token is FAILED_PRECONDITION first, as the host looks the token up first
        check_dead_letter_lengths(reason, description)
        self._settle(token, "dead_letter", reason=reason, error_description=description)

    def defer(self, token: str, properties_to_modify: bytes) -> None:
        """Defer the message."""
        self._settle(token, "defer")

    def renew_message_lock(self, token: str) -> None:
        """Renew the message's lock."""
        delivery = self._find(token)
        try:
            delivery.receiver.renew_message_lock(delivery.message)
        except ServiceBusError as exc:
            raise Refused(grpc.StatusCode.UNKNOWN, f"renewing LockToken {token} failed: {exc}") from exc

    def _session(self, session_id: str) -> Any:
        """The session as its current holder has it: the newest live delivery of it whose receiver is still
        open (one let go under a running invocation is closed, and another receiver may hold it now)."""
        for delivery in reversed(self._deliveries.sessions()):
            receiver = delivery.receiver
            closed = getattr(receiver, "_shutdown", None)  # the SDK's handler sets it on close
            if receiver.session.session_id == session_id and not (closed is not None and closed.is_set()):
                return receiver.session
        raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"Session {session_id} not found.")

    def get_session_state(self, session_id: str) -> bytes:
        """The session's state."""
        return bytes(self._session(session_id).get_state() or b"")

    def set_session_state(self, session_id: str, state: bytes) -> None:
        """Set the session's state."""
        self._session(session_id).set_state(state)

    def release_session(self, session_id: str) -> None:
        """As the extension's ReleaseSession (the session processor's CancelAsync): no new receive for the session
        once the invocations under way return, then its receiver is closed; a session not held is refused."""
        self._session(session_id)
        for delivery in self._deliveries.sessions():
            if delivery.receiver.session.session_id == session_id:
                setattr(delivery.receiver, RELEASE_REQUESTED, True)

    def renew_session_lock(self, session_id: str) -> datetime:
        """Renew the session lock."""
        session = self._session(session_id)
        try:
            session.renew_lock()
        except (ServiceBusError, ValueError) as exc:  # ValueError: the SDK's answer for a closed receiver
            raise Refused(grpc.StatusCode.UNKNOWN, f"renewing the lock of session {session_id} failed: {exc}") from exc
        return session.locked_until_utc or datetime.now(UTC) + timedelta(minutes=1)


def check_dead_letter_lengths(reason: str | None, description: str | None) -> None:
    """Refuse a dead-letter reason or description longer than the .NET SDK allows, with the host's answer.

    The extension's SettlementService (Microsoft.Azure.WebJobs.Extensions.ServiceBus, src/Grpc/SettlementService.cs)
    turns every exception of a settlement into ``RpcException(new Status(StatusCode.Unknown, ex.ToString()))``;
    here that is the ArgumentOutOfRangeException of Argument.AssertNotTooLong, without the .NET stack trace. The
    length is .NET's ``string.Length``: UTF-16 code units, so a character outside the BMP counts two.
    """
    for name, value in (("deadLetterReason", reason), ("deadLetterErrorDescription", description)):
        if value is not None and len(value.encode("utf-16-le")) // 2 > MAX_DEAD_LETTER_REASON_LENGTH:
            raise Refused(grpc.StatusCode.UNKNOWN,
                          f"System.ArgumentOutOfRangeException: The argument '{name}' cannot exceed "
                          f"{MAX_DEAD_LETTER_REASON_LENGTH} characters. (Parameter '{name}')")


def add_settlement(server: grpc.Server, deliveries: Deliveries) -> None:
    """Serve Settlement on ``server``, beside the FunctionRpc EventStream."""
    pb_grpc.add_SettlementServicer_to_server(SettlementService(LiveDeliveries(deliveries)), server)
