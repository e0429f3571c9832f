"""Service Bus ``$management`` operations (request/response over the ``<entity>/$management`` node).

A request carries ``operation`` (``com.microsoft:...``) in its application properties and a map body;
the answer carries ``statusCode`` / ``statusDescription`` (and ``errorCondition`` on failure, which
the SDK maps to its exception types) with a map body. 204 means "nothing" for peek and
get-message-sessions, which the SDK turns into an empty list. Keys and value types follow what the
SDK sends and parses (``azure/servicebus/_servicebus_receiver.py``, ``_servicebus_sender.py``,
``_servicebus_session.py``, ``_common/mgmt_handlers.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proton import timestamp

from devservers.servicebus import wire
from devservers.servicebus.errors import ARGUMENT_ERROR, NOT_IMPLEMENTED, BrokerError
from devservers.servicebus.store import Outcome, Queue, ReceivableEntity, Topic

__all__ = ["Request", "Response", "handle"]

log = logging.getLogger("devservers.servicebus")

VENDOR = "com.microsoft:"
INTERNAL_ERROR = "amqp:internal-error"

# update-disposition's statuses (the SDK's MESSAGE_MGMT_SETTLEMENT_TERM_MAP; "defered" is its spelling).
_DISPOSITIONS = {
    "completed": Outcome.COMPLETE,
    "abandoned": Outcome.ABANDON,
    "defered": Outcome.DEFER,
    "deferred": Outcome.DEFER,
    "suspended": Outcome.DEAD_LETTER,
}


@dataclass
class Request:
    operation: str
    body: dict[str, Any]
    #: The receiver (a store lock owner) named by ``associated-link-name``, if it is open on this connection.
    owner: object | None
    now: float


@dataclass
class Response:
    status_code: int
    description: str
    body: dict[str, Any]
    condition: str | None = None


def _ok(body: dict[str, Any] | None = None) -> Response:
    return Response(200, "OK", body or {})


def _no_content() -> Response:
    return Response(204, "No Content", {})


def _receivable(node: ReceivableEntity | Topic) -> ReceivableEntity:
    if not isinstance(node, ReceivableEntity):
        raise BrokerError(ARGUMENT_ERROR, f"The operation is not supported on topic '{node.path}'.")
    return node


def _sendable(node: ReceivableEntity | Topic) -> Queue | Topic:
    if not isinstance(node, Queue | Topic):
        raise BrokerError(ARGUMENT_ERROR, f"Messages cannot be scheduled on '{node.path}'.")
    return node


def _session_id(request: Request) -> str | None:
    value = request.body.get("session-id")
    return None if value is None else str(value)


def _required_session_id(request: Request) -> str:
    session_id = _session_id(request)
    if session_id is None:
        raise BrokerError(ARGUMENT_ERROR, "The request must specify session-id.")
    return session_id


def _renew_lock(node: ReceivableEntity | Topic, request: Request) -> Response:
    entity = _receivable(node)
    tokens = wire.uuid_list(request.body["lock-tokens"])
    expirations = [entity.renew_lock(token, request.now) for token in tokens]
    return _ok({"expirations": wire.timestamp_array(expirations)})


def _peek(node: ReceivableEntity | Topic, request: Request) -> Response:
    entity = _receivable(node)
    start = int(request.body.get("from-sequence-number", 1))
    count = int(request.body.get("message-count", 1))
    messages = entity.browser.peek(start, max(count, 0), request.now, session_id=_session_id(request))
    if not messages:
        return _no_content()
    return _ok({"messages": [{"message": wire.encode_delivery(m, delivering=False)} for m in messages]})


def _receive_by_sequence_number(node: ReceivableEntity | Topic, request: Request) -> Response:
    entity = _receivable(node)
    numbers = wire.int_list(request.body["sequence-numbers"])
    # receiver-settle-mode: 0 (first) is ReceiveAndDelete, 1 (second) PeekLock.
    peek_lock = int(request.body.get("receiver-settle-mode", 1)) != 0
    owner = request.owner if request.owner is not None else object()
    messages = entity.receive_deferred(
        numbers, owner, request.now, peek_lock=peek_lock, session_id=_session_id(request)
    )
    if not messages:
        return _no_content()
    entries = []
    for message in messages:
        encoded = wire.encode_delivery(message, delivering=True, locked_until=message.locked_until)
        entry: dict[str, Any] = {"message": encoded}
        if message.lock_token is not None:
            entry["lock-token"] = message.lock_token
        entries.append(entry)
    return _ok({"messages": entries})


def _schedule(node: ReceivableEntity | Topic, request: Request) -> Response:
    target = _sendable(node)
    envelopes = []
    for item in request.body["messages"]:
        raw = bytes(item["message"])
        target.intake.check_size(len(raw))
        envelopes.append(wire.envelope_of(wire.parse_message(raw)))
    numbers = target.intake.send(envelopes, request.now)
    return _ok({"sequence-numbers": wire.long_array(numbers)})


def _cancel_scheduled(node: ReceivableEntity | Topic, request: Request) -> Response:
    _sendable(node).intake.cancel(wire.int_list(request.body["sequence-numbers"]), request.now)
    return _ok()


def _update_disposition(node: ReceivableEntity | Topic, request: Request) -> Response:
    entity = _receivable(node)
    status = str(request.body["disposition-status"]).lower()
    outcome = _DISPOSITIONS.get(status)
    if outcome is None:
        raise BrokerError(ARGUMENT_ERROR, f"Unknown disposition-status {status!r}.")
    reason = request.body.get("deadletter-reason")
    description = request.body.get("deadletter-description")
    for token in wire.uuid_list(request.body["lock-tokens"]):
        entity.settle(
            token,
            outcome,
            request.now,
            dead_letter_reason=None if reason is None else str(reason),
            dead_letter_description=None if description is None else str(description),
        )
    return _ok()


def _renew_session_lock(node: ReceivableEntity | Topic, request: Request) -> Response:
    until = _receivable(node).sessions.renew(_required_session_id(request), request.owner, request.now)
    return _ok({"expiration": timestamp(round(until * 1000))})


def _get_session_state(node: ReceivableEntity | Topic, request: Request) -> Response:
    session = _receivable(node).sessions.owned(_required_session_id(request), request.owner, request.now)
    return _ok({"session-state": session.state})


def _set_session_state(node: ReceivableEntity | Topic, request: Request) -> Response:
    state = request.body.get("session-state")
    _receivable(node).sessions.set_state(
        _required_session_id(request), request.owner, None if state is None else bytes(state), request.now
    )
    return _ok()


def _get_message_sessions(node: ReceivableEntity | Topic, request: Request) -> Response:
    entity = _receivable(node)
    skip = int(request.body.get("skip", 0))
    top = int(request.body.get("top", 100))
    ids = entity.sessions.ids()[skip : skip + top]
    if not ids:
        return _no_content()
    return _ok({"skip": skip + len(ids), "sessions-ids": ids})


_OPERATIONS: dict[str, Callable[[ReceivableEntity | Topic, Request], Response]] = {
    "renew-lock": _renew_lock,
    "peek-message": _peek,
    "receive-by-sequence-number": _receive_by_sequence_number,
    "schedule-message": _schedule,
    "cancel-scheduled-message": _cancel_scheduled,
    "update-disposition": _update_disposition,
    "renew-session-lock": _renew_session_lock,
    "get-session-state": _get_session_state,
    "set-session-state": _set_session_state,
    "get-message-sessions": _get_message_sessions,
}


def handle(node: ReceivableEntity | Topic, request: Request) -> Response:
    """Run one management request against ``node``; failures become error responses, never exceptions."""
    name = request.operation.removeprefix(VENDOR)
    operation = _OPERATIONS.get(name)
    if operation is None:
        return Response(501, f"The operation {request.operation!r} is not supported.", {}, NOT_IMPLEMENTED)
    try:
        return operation(node, request)
    except BrokerError as err:
        return Response(err.status_code, err.description, {}, err.condition)
    except (KeyError, TypeError, ValueError, wire.DecodeError) as err:
        return Response(400, f"Malformed {name} request: {err!r}", {}, ARGUMENT_ERROR)
    except Exception as err:  # a broker bug: answer it rather than leave the client waiting
        log.exception("management operation %s failed", name)
        return Response(500, f"The broker failed to run {name}: {err!r}", {}, INTERNAL_ERROR)
