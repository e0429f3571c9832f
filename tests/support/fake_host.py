"""A stand-in for the Functions host: its Settlement gRPC service and its Service Bus message hand-over.

Two halves, both exercising the real extension code rather than a mock of it:

* ``FakeSettlementServer`` serves the host's ``Settlement`` gRPC service (the proto shipped in
  ``azurefunctions.extensions.bindings.protos``) on 127.0.0.1: the local host's own ``SettlementService``
  (``devservers.host.settlement``), over a ``SettlementRecorder`` that records each call and answers the
  faults it was given. ``running_fake_host()`` / the ``fake_host`` fixture point the real
  ``ServiceBusMessageActions`` client at it by patching ``sys.argv`` the way the host launches the worker,
  so request building and the gRPC round trip are the production code's.
* ``make_received_message()`` builds an AMQP message from its fields and encodes it with the local host's
  own ``binding_data`` (16-byte lock token, then the whole AMQP message: header, delivery annotations with
  ``x-opt-lock-token``, message annotations, properties, application properties, body), then decodes it
  through the extension's ``ServiceBusConverter``.

Behaviour of the pinned extension (1.0.0b2) that this reproduces, on purpose: its decoder keeps only the bytes
after the first ``x-opt-lock-token`` marker, so the AMQP header the host sends (delivery count, TTL,
durable, priority) is dropped and ``msg.delivery_count`` / ``msg.time_to_live`` are ``None``.
``layout="marker_prefix"`` places a marker before the message so the header survives; the host never
sends that layout.
"""

from __future__ import annotations

import itertools
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import grpc
import pytest
from azure.servicebus import ServiceBusReceivedMessage
from azure.servicebus._pyamqp.message import Header, Message, Properties
from azurefunctions.extensions.base import Datum
from azurefunctions.extensions.bindings.protos import settlement_pb2_grpc as pb_grpc
from azurefunctions.extensions.bindings.servicebus import ServiceBusConverter, ServiceBusMessageActions
from azurefunctions.extensions.bindings.servicebus import (
    ServiceBusReceivedMessage as ServiceBusReceivedMessageBinding,
)

from devservers.host.servicebus import binding_data
from devservers.host.settlement import Refused, SettlementService, check_dead_letter_lengths

__all__ = [
    "ACTIONS",
    "LOCK_LOST",
    "LOCK_TOKEN_NOT_FOUND",
    "MESSAGE_ACTIONS",
    "FakeHost",
    "FakeSettlementServer",
    "Fault",
    "Settlement",
    "SettlementRecorder",
    "decode_model_binding_data",
    "fake_host_fixture",
    "make_model_binding_data",
    "make_received_message",
    "running_fake_host",
]

# Every RPC of the Settlement service, under the action name recorded for it.
ACTIONS: dict[str, str] = {
    "Complete": "complete",
    "Abandon": "abandon",
    "Deadletter": "deadletter",
    "Defer": "defer",
    "RenewMessageLock": "renew_lock",
    "GetSessionState": "get_session_state",
    "SetSessionState": "set_session_state",
    "ReleaseSession": "release_session",
    "RenewSessionLock": "renew_session_lock",
}
# Actions addressed by a message lock token (the rest are addressed by session id).
MESSAGE_ACTIONS = frozenset({"complete", "abandon", "deadletter", "defer", "renew_lock"})
_TERMINAL_ACTIONS = frozenset({"complete", "abandon", "deadletter", "defer"})

# What the host's SettlementService answers (Microsoft.Azure.WebJobs.Extensions.ServiceBus.Grpc):
# an exception from the Service Bus SDK becomes UNKNOWN with the exception text; a lock token it does not
# hold becomes FAILED_PRECONDITION "LockToken <t> not found.".
LOCK_LOST = (
    "Azure.Messaging.ServiceBus.ServiceBusException: The lock supplied is invalid. Either the lock expired, "
    "or the message has already been removed from the queue. (MessageLockLost)"
)
LOCK_TOKEN_NOT_FOUND = "LockToken {lock_token} not found."

_MAX_MESSAGE_LENGTH = 2_147_483_647  # what the host passes as --functions-grpc-max-message-length
_HOST = "127.0.0.1"


def _token(lock_token: uuid.UUID | str) -> str:
    """A lock token as the client sends it: ``str(uuid)``, lower case with hyphens."""
    try:
        return str(uuid.UUID(str(lock_token)))
    except ValueError:
        return str(lock_token)


@dataclass(frozen=True)
class Settlement:
    """One Settlement RPC as the fake host received it."""

    action: str
    lock_token: str | None = None
    reason: str | None = None
    description: str | None = None
    properties_to_modify: bytes = b""
    session_id: str | None = None
    session_state: bytes | None = None


@dataclass
class Fault:
    """An injected failure: matching calls are answered with ``code``/``details`` instead of succeeding."""

    action: str | None = None
    lock_token: str | None = None
    session_id: str | None = None
    remaining: int | None = 1  # None: every matching call, forever
    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    details: str = LOCK_LOST
    applied: bool = False  # True: the settlement takes effect and is recorded, then the reply fails

    def matches(self, call: Settlement) -> bool:
        """Whether this fault applies to ``call``."""
        return (
            (self.remaining is None or self.remaining > 0)
            and (self.action is None or self.action == call.action)
            and (self.lock_token is None or self.lock_token == call.lock_token)
            and (self.session_id is None or self.session_id == call.session_id)
        )


@dataclass
class _Verdict:
    record: bool
    error: tuple[grpc.StatusCode, str] | None = None


class SettlementRecorder:
    """Thread-safe record of settlements, session state and injected faults of the fake host."""

    def __init__(
        self, *, reject_duplicate_settlement: bool = True, session_lock_duration: timedelta = timedelta(minutes=1)
    ) -> None:
        """Create an empty recorder; a second terminal settlement of a lock token fails unless disabled."""
        self.reject_duplicate_settlement = reject_duplicate_settlement
        self.session_lock_duration = session_lock_duration
        self._lock = threading.Lock()
        self._accepted: list[Settlement] = []
        self._rejected: list[tuple[Settlement, grpc.StatusCode, str]] = []
        self._faults: list[Fault] = []
        self._settled: dict[str, str] = {}
        self._session_state: dict[str, bytes] = {}

    # -- fault injection -------------------------------------------------------------------------------

    def fail_next(
        self,
        action: str | None = None,
        count: int = 1,
        code: grpc.StatusCode = grpc.StatusCode.UNKNOWN,
        details: str = LOCK_LOST,
        *,
        applied: bool = False,
    ) -> Fault:
        """Fail the next ``count`` calls of ``action`` (any action when None); the client raises SettlementError."""
        return self.add_fault(Fault(action=action, remaining=count, code=code, details=details, applied=applied))

    def fail_lock_token(
        self,
        lock_token: uuid.UUID | str,
        action: str | None = None,
        count: int | None = None,
        code: grpc.StatusCode = grpc.StatusCode.UNKNOWN,
        details: str = LOCK_LOST,
        *,
        applied: bool = False,
    ) -> Fault:
        """Fail calls for one lock token (all of them unless ``count``): a lost lock."""
        fault = Fault(
            action=action, lock_token=_token(lock_token), remaining=count, code=code, details=details, applied=applied
        )
        return self.add_fault(fault)

    def add_fault(self, fault: Fault) -> Fault:
        """Register a custom fault; faults are checked in the order they were added."""
        if fault.action is not None and fault.action not in ACTIONS.values():
            raise ValueError(f"unknown action {fault.action!r}; expected one of {sorted(ACTIONS.values())}")
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        """Remove every injected fault."""
        with self._lock:
            self._faults.clear()

    # -- queries ---------------------------------------------------------------------------------------

    def all(self) -> list[Settlement]:
        """Every accepted call, in arrival order."""
        with self._lock:
            return list(self._accepted)

    def settlements_for(self, lock_token: uuid.UUID | str) -> list[Settlement]:
        """Accepted calls for one lock token, in arrival order."""
        token = _token(lock_token)
        with self._lock:
            return [s for s in self._accepted if s.lock_token == token]

    def rejected(self) -> list[tuple[Settlement, grpc.StatusCode, str]]:
        """Calls answered with an error (injected or duplicate settlement), with the status sent."""
        with self._lock:
            return list(self._rejected)

    def session_state(self, session_id: str) -> bytes | None:
        """The state last set for a session, or None."""
        with self._lock:
            return self._session_state.get(session_id)

    def clear(self) -> None:
        """Forget calls, settled lock tokens, session state and faults."""
        with self._lock:
            self._accepted.clear()
            self._rejected.clear()
            self._faults.clear()
            self._settled.clear()
            self._session_state.clear()

    # -- used by the servicer --------------------------------------------------------------------------

    def handle(self, call: Settlement) -> _Verdict:
        """Decide the answer to ``call`` atomically and record it."""
        with self._lock:
            verdict = self._decide(call)
            if verdict.record:
                self._accepted.append(call)
                if call.action in _TERMINAL_ACTIONS and call.lock_token is not None:
                    self._settled[call.lock_token] = call.action
                if call.action == "set_session_state" and call.session_id is not None:
                    self._session_state[call.session_id] = call.session_state or b""
                if call.action == "release_session" and call.session_id is not None:
                    self._session_state.pop(call.session_id, None)
            if verdict.error is not None:
                self._rejected.append((call, *verdict.error))
            return verdict

    def _decide(self, call: Settlement) -> _Verdict:
        for fault in self._faults:
            if fault.matches(call):
                if fault.remaining is not None:
                    fault.remaining -= 1
                return _Verdict(record=fault.applied, error=(fault.code, fault.details))
        if (
            self.reject_duplicate_settlement
            and call.action in MESSAGE_ACTIONS
            and call.lock_token in self._settled
        ):
            return _Verdict(record=False, error=(grpc.StatusCode.UNKNOWN, LOCK_LOST))
        return _Verdict(record=True)

    def get_state(self, session_id: str) -> bytes:
        """Session state as GetSessionState returns it (empty when unset)."""
        with self._lock:
            return self._session_state.get(session_id, b"")

    # -- the host's Settlement calls, as its SettlementService hands them over -------------------------

    def _answer(self, call: Settlement) -> None:
        verdict = self.handle(call)
        if verdict.error is not None:
            raise Refused(*verdict.error)

    def complete(self, token: str) -> None:
        """Record a complete."""
        self._answer(Settlement("complete", lock_token=token))

    def abandon(self, token: str, properties_to_modify: bytes) -> None:
        """Record an abandon."""
        self._answer(Settlement("abandon", lock_token=token, properties_to_modify=properties_to_modify))

    def deadletter(self, token: str, reason: str | None, description: str | None, properties_to_modify: bytes) -> None:
        """Record a dead-letter with its reason and description (None when the client left them unset); refuse a
        reason or description over 4,096 characters, as the host's Settlement service does."""
        check_dead_letter_lengths(reason, description)
        self._answer(Settlement("deadletter", lock_token=token, reason=reason, description=description,
                                properties_to_modify=properties_to_modify))

    def defer(self, token: str, properties_to_modify: bytes) -> None:
        """Record a defer."""
        self._answer(Settlement("defer", lock_token=token, properties_to_modify=properties_to_modify))

    def renew_message_lock(self, token: str) -> None:
        """Record a message lock renewal."""
        self._answer(Settlement("renew_lock", lock_token=token))

    def get_session_state(self, session_id: str) -> bytes:
        """Record a session state read; the stored state."""
        self._answer(Settlement("get_session_state", session_id=session_id))
        return self.get_state(session_id)

    def set_session_state(self, session_id: str, state: bytes) -> None:
        """Record and store a session state."""
        self._answer(Settlement("set_session_state", session_id=session_id, session_state=state))

    def release_session(self, session_id: str) -> None:
        """Record a session release."""
        self._answer(Settlement("release_session", session_id=session_id))

    def renew_session_lock(self, session_id: str) -> datetime:
        """Record a session lock renewal; it now ends the recorder's session lock duration from now."""
        self._answer(Settlement("renew_session_lock", session_id=session_id))
        return datetime.now(UTC) + self.session_lock_duration


class FakeSettlementServer:
    """The host's Settlement gRPC service on 127.0.0.1 with an OS-chosen free port."""

    def __init__(self, recorder: SettlementRecorder | None = None, *, max_workers: int = 32) -> None:
        """Create (not start) a server recording into ``recorder``."""
        self.recorder = recorder or SettlementRecorder()
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="fake-host"),
            options=[
                ("grpc.max_send_message_length", _MAX_MESSAGE_LENGTH),
                ("grpc.max_receive_message_length", _MAX_MESSAGE_LENGTH),
                ("grpc.so_reuseport", 0),
            ],
        )
        pb_grpc.add_SettlementServicer_to_server(SettlementService(self.recorder), self._server)
        self.port: int = self._server.add_insecure_port(f"{_HOST}:0")
        if not self.port:
            raise RuntimeError("could not bind the fake Settlement server on 127.0.0.1")
        self.host = _HOST

    def start(self) -> FakeSettlementServer:
        """Start serving; returns self."""
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop serving; the short grace lets client channels see a clean GOAWAY instead of logging a cancel."""
        self._server.stop(grace=0.5).wait()


def _worker_argv(host: str, port: int, max_message_length: int) -> list[str]:
    """The worker's command line as the host writes it (both the legacy and the functions- spellings)."""
    worker_id, request_id = str(uuid.uuid4()), str(uuid.uuid4())
    return [
        sys.argv[0] if sys.argv else "worker.py",
        "--host", host,
        "--port", str(port),
        "--workerId", worker_id,
        "--requestId", request_id,
        "--grpcMaxMessageLength", str(max_message_length),
        "--functions-uri", f"http://{host}:{port}/",
        "--functions-worker-id", worker_id,
        "--functions-request-id", request_id,
        "--functions-grpc-max-message-length", str(max_message_length),
    ]  # fmt: skip


def _reset_message_actions() -> None:
    with ServiceBusMessageActions._lock:
        ServiceBusMessageActions._instance = None


@dataclass
class FakeHost:
    """A running fake host: its recorder, its address, and the worker-side settlement client."""

    server: FakeSettlementServer
    argv: list[str] = field(default_factory=list)

    @property
    def recorder(self) -> SettlementRecorder:
        """The recorder of this host's Settlement service."""
        return self.server.recorder

    @property
    def address(self) -> str:
        """host:port of the Settlement service."""
        return f"{self.server.host}:{self.server.port}"

    def message_actions(self) -> ServiceBusMessageActions:
        """The real ``ServiceBusMessageActions`` singleton, as the worker injects it."""
        return ServiceBusMessageActions.get_instance()


@contextmanager
def running_fake_host(
    recorder: SettlementRecorder | None = None, *, max_message_length: int = _MAX_MESSAGE_LENGTH
) -> Iterator[FakeHost]:
    """Start a fake host, point the worker's argv and the settlement client at it; undo both on exit."""
    server = FakeSettlementServer(recorder).start()
    saved_argv = sys.argv
    argv = _worker_argv(server.host, server.port, max_message_length)
    _reset_message_actions()
    sys.argv = argv
    try:
        yield FakeHost(server=server, argv=list(argv))
    finally:
        sys.argv = saved_argv
        _reset_message_actions()
        server.stop()


@pytest.fixture(name="fake_host")
def fake_host_fixture() -> Iterator[FakeHost]:
    """Fixture ``fake_host``: a fresh fake host per test (starting one takes a few milliseconds)."""
    with running_fake_host() as host:
        yield host


# -- messages as the host hands them over ---------------------------------------------------------------


_UNSET: Any = object()
_LOCK_TOKEN_MARKER = b"x-opt-lock-token"


def _keyed(properties: dict[str, Any] | None) -> dict[str | bytes, Any] | None:
    return {k: v for k, v in properties.items()} if properties else None


def _ms(value: datetime) -> int:
    if value.tzinfo is None:
        raise ValueError("datetimes must be timezone-aware")
    return int(value.timestamp() * 1000)


_SEQUENCE_NUMBERS = itertools.count(1)


def make_model_binding_data(
    body: bytes | None = b"",
    *,
    message_id: str | None,
    correlation_id: str | None = None,
    session_id: str | None = None,
    delivery_count: int = 0,
    enqueued_time: datetime | None = None,
    locked_until: datetime | None = None,
    sequence_number: int | None = None,
    application_properties: dict[str, Any] | None = None,
    lock_token: uuid.UUID | None = None,
    content_type: str | None = "application/json",
    subject: str | None = None,
    time_to_live: timedelta | None = None,
    body_value: Any = _UNSET,
    layout: Literal["host", "marker_prefix"] = "host",
) -> Any:
    """The model_binding_data the host sends for one received message (see ``make_received_message``), as
    the local host encodes it (``devservers.host.servicebus.binding_data``).

    Without ``sequence_number`` each call is another message, as a producer's copy is; pass the same
    number to model a redelivery of one message.
    """
    if sequence_number is None:
        sequence_number = next(_SEQUENCE_NUMBERS)
    if body_value is not _UNSET and body:
        raise ValueError("pass either body or body_value, not both")
    token = lock_token or uuid.uuid4()
    enqueued = enqueued_time or datetime.now(UTC).replace(microsecond=0)
    ttl_ms = int(time_to_live.total_seconds() * 1000) if time_to_live is not None else None
    data, value = ([body or b""], None) if body_value is _UNSET else (None, body_value)
    amqp = Message(
        header=Header(ttl=ttl_ms, delivery_count=delivery_count),
        message_annotations={b"x-opt-enqueued-time": _ms(enqueued), b"x-opt-sequence-number": sequence_number,
                             b"x-opt-locked-until": _ms(locked_until or enqueued + timedelta(minutes=1))},
        properties=Properties(
            message_id=message_id, subject=subject, correlation_id=correlation_id, content_type=content_type,
            absolute_expiry_time=_ms(enqueued + time_to_live) if time_to_live is not None else None,
            creation_time=_ms(enqueued), group_id=session_id,
        ),
        application_properties=_keyed(application_properties), data=data, value=value,
    )
    encoded = binding_data(token, amqp)
    if layout == "marker_prefix":
        encoded.content = token.bytes_le + _LOCK_TOKEN_MARKER + encoded.content[16:]
    elif layout != "host":
        raise ValueError(f"unknown layout {layout!r}")
    return encoded


def decode_model_binding_data(data: Any) -> ServiceBusReceivedMessage:
    """Decode through the extension's ``ServiceBusConverter`` as the worker does for a trigger parameter."""
    message = ServiceBusConverter.decode(
        Datum(value=data, type="model_binding_data"),
        trigger_metadata={},
        pytype=ServiceBusReceivedMessageBinding,
    )
    if not isinstance(message, ServiceBusReceivedMessage):
        raise TypeError(f"converter returned {type(message).__name__}, not ServiceBusReceivedMessage")
    return message


def make_received_message(body: bytes | None = b"", **fields: Any) -> ServiceBusReceivedMessage:
    """A real ``ServiceBusReceivedMessage`` built from host-format bytes through the extension's converter.

    Takes the keyword arguments of ``make_model_binding_data``: ``message_id=None`` sends no MessageId,
    ``body_value`` sends an AMQP value body instead of a data body. With the default ``layout="host"`` the
    pinned extension drops the AMQP header, so ``delivery_count`` and ``time_to_live`` read back as None;
    ``layout="marker_prefix"`` keeps them (not what the host sends).
    """
    return decode_model_binding_data(make_model_binding_data(body, **fields))
