"""The AMQP side of the broker, on python-qpid-proton's reactor.

One handler serves every connection. It speaks the conventions ``azure-servicebus`` expects of
Service Bus (read from the SDK's source):

* SASL ANONYMOUS, then a claims-based-security put-token over the ``$cbs`` link pair,
  answered with ``status-code`` 200 whatever the token: this is a test peer, not an auth check.
* Entities are addressed by full URI (``amqps://host:port/orders``); request/response nodes by path
  (``orders/$management``).
* Deliveries to receivers carry 16-byte delivery tags that are the lock token's ``bytes_le`` (the SDK
  reads the token as ``UUID(bytes_le=tag)``). proton's Python ``Delivery.tag`` decodes tags as UTF-8,
  so the token is kept on the delivery as an attribute instead of being read back from the tag.
* The SDK (7.15) sends settlements unsettled and waits for the broker to settle with the outcome it
  applied; without that echo it retries through ``$management``. Every disposition is therefore
  answered with a settled disposition: the same outcome, or ``rejected`` with the Service Bus error
  (e.g. ``com.microsoft:message-lock-lost``) when it cannot be applied.
* Session receivers ask for a session in the source filter ``com.microsoft:session-filter`` (an id, or
  null for the next available one); the attach is answered with the chosen id in the same filter and
  ``com.microsoft:locked-until-utc`` (.NET ticks) in the link properties. With no session available,
  the attach is held until one is, or until the link's ``com.microsoft:timeout`` ends it with the
  ``com.microsoft:timeout`` error (the SDK's OperationTimeoutError).

proton's Python wrapper objects are recreated per event, but attributes set on them live in the C
object's record, so per-link and per-delivery state is stored as attributes (``sb_info``,
``sb_token``). All broker state is touched only on the reactor thread.
"""

from __future__ import annotations

import enum
import functools
import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proton import Condition, Connection, Delivery, Disposition, Event, Link, Message, Terminus, symbol
from proton.reactor import ApplicationEvent, Container, EventInjector, Handler

from devservers.servicebus import management, wire
from devservers.servicebus.errors import NOT_ALLOWED, SESSION_LOCK_LOST, TIMEOUT, BrokerError
from devservers.servicebus.store import (
    Namespace,
    Outcome,
    ReceivableEntity,
    SendTarget,
    Session,
    StoredMessage,
    Topic,
)

__all__ = ["BrokerHandler", "ReactorThreadBroker"]

log = logging.getLogger("devservers.servicebus")

SESSION_FILTER = symbol("com.microsoft:session-filter")
LOCKED_UNTIL_UTC = symbol("com.microsoft:locked-until-utc")
OPERATION_TIMEOUT = symbol("com.microsoft:timeout")
DECODE_ERROR = "amqp:decode-error"
INTERNAL_ERROR = "amqp:internal-error"
#: .NET ticks (100 ns) at the Unix epoch: Service Bus's locked-until-utc is a .NET DateTime.
DOTNET_EPOCH_TICKS = 621355968000000000
MAX_MESSAGE_SIZE = 256 * 1024  # Standard tier and emulator; the SDK sizes batches from it
INCOMING_CREDIT = 100
TICK_SECONDS = 0.05
DEFAULT_SESSION_WAIT = 60.0  # Service Bus's default operation timeout when the link names none
MANAGEMENT_SUFFIX = "/$management"
STOP_GRACE_SECONDS = 0.1


class Kind(enum.Enum):
    CBS_REQUESTS = "cbs-requests"
    CBS_REPLIES = "cbs-replies"
    MANAGEMENT_REQUESTS = "management-requests"
    MANAGEMENT_REPLIES = "management-replies"
    SEND = "send"  # the client sends to a queue or topic
    RECEIVE = "receive"  # the client receives from a queue, subscription or dead-letter queue


@dataclass(eq=False)
class LinkInfo:
    """Broker state of one attached link. For receivers it is also the owner of the locks they hold."""

    link_id: int
    connection_id: int
    kind: Kind
    name: str
    address: str
    target: SendTarget | None = None
    entity: ReceivableEntity | None = None
    node: ReceivableEntity | Topic | None = None
    peek_lock: bool = True
    wants_session: bool = False
    session: Session | None = None
    session_wait_deadline: float | None = None
    pending_replies: deque[bytes] = field(default_factory=deque)
    closed: bool = False


def entity_path(address: str | None) -> str:
    """``amqps://host:port/orders/$DeadLetterQueue`` -> ``orders/$DeadLetterQueue``; paths pass through."""
    if not address:
        return ""
    if "://" in address:
        address = address.split("://", 1)[1]
        address = address.split("/", 1)[1] if "/" in address else ""
    return address.strip("/")


def _ticks(seconds: float) -> int:
    return DOTNET_EPOCH_TICKS + round(seconds * 10_000_000)


def _link_of(event: Event) -> Link:
    link = event.link
    if link is None:
        raise RuntimeError(f"{event.type} without a link")
    return link


def _delivery_of(event: Event) -> Delivery:
    delivery = event.delivery
    if delivery is None:
        raise RuntimeError(f"{event.type} without a delivery")
    return delivery


def _new_delivery(link: Link, tag: bytes) -> Delivery:
    """A delivery with a binary tag (proton's annotation says str, but it takes bytes as they are)."""
    tag_any: Any = tag
    return link.delivery(tag_any)


def _condition(name: str, description: str) -> Condition:
    """An AMQP error whose info map is never empty.

    The SDK reads a rejected send's error as ``[condition, description, info]`` by index, so the info
    field must be on the wire; proton leaves out an empty map (and the trailing null with it). Service
    Bus errors carry a tracking id there, so this does too.
    """
    return Condition(name, description, {symbol("com.microsoft:tracking-id"): str(uuid.uuid4())})


_EventMethod = Callable[["BrokerHandler", Event], None]


def _guarded(method: _EventMethod) -> _EventMethod:
    """Keep the reactor alive: an exception in one event fails that link (or connection), not the broker."""

    @functools.wraps(method)
    def wrapper(self: BrokerHandler, event: Event) -> None:
        try:
            method(self, event)
        except Exception:
            log.exception("%s failed", method.__name__)
            self._fail(event)

    return wrapper


class BrokerHandler(Handler):
    """proton event handler: maps AMQP events onto the store and management operations."""

    def __init__(self, namespace: Namespace) -> None:
        super().__init__()
        self.namespace = namespace
        self._ids = itertools.count(1)
        self._links: dict[int, tuple[Link, LinkInfo]] = {}
        self._by_connection: dict[int, set[int]] = {}
        self._connections: dict[int, Connection] = {}
        self._receivers: dict[int, tuple[Link, LinkInfo]] = {}
        self.acceptor: Any = None
        self.injector: EventInjector | None = None
        self.container: Container | None = None
        self._stopping = False

    # -- lifecycle ----------------------------------------------------------------------------

    @_guarded
    def on_reactor_init(self, event: Event) -> None:
        event.container.schedule(TICK_SECONDS, self)

    def on_timer_task(self, event: Event) -> None:
        if self._stopping:
            return
        try:
            self._tick(time.time())
        except Exception:
            log.exception("broker tick failed")
        event.container.schedule(TICK_SECONDS, self)

    @_guarded
    def on_sb_stop(self, event: Event) -> None:
        """ApplicationEvent from :meth:`ReactorThreadBroker.stop`, delivered on the reactor thread.

        Stop listening and close every connection (the close frames go out on the next turn), then
        cut the sockets a moment later, so that clients see the broker go away instead of waiting on
        a silent socket; then stop the reactor.
        """
        self._stopping = True
        if self.acceptor is not None:
            self.acceptor.close()
        for connection in list(self._connections.values()):
            if not connection.state & Link.LOCAL_CLOSED:
                connection.close()
        if self.container is not None:
            self.container.schedule(STOP_GRACE_SECONDS, _Call(self._cut_connections))
            self.container.schedule(2 * STOP_GRACE_SECONDS, _Call(self._stop_reactor))

    def _cut_connections(self) -> None:
        for connection in list(self._connections.values()):
            transport = connection.transport
            if transport is not None and not transport.closed:
                transport.close_tail()
                transport.close_head()

    def _stop_reactor(self) -> None:
        if self.injector is not None:
            self.injector.close()
        if self.container is not None:
            self.container.stop()

    def _fail(self, event: Event) -> None:
        """After an unexpected error: detach the event's link, or close its connection, with internal-error."""
        try:
            link = event.link
            if link is not None:
                info = getattr(link, "sb_info", None)
                if isinstance(info, LinkInfo):
                    self._forget_link(info)
                link.condition = _condition(INTERNAL_ERROR, "The broker failed to process a request on this link.")
                if not link.state & Link.LOCAL_CLOSED:
                    link.close()
            elif event.connection is not None and not event.connection.state & Link.LOCAL_CLOSED:
                event.connection.condition = _condition(INTERNAL_ERROR, "The broker failed; closing the connection.")
                event.connection.close()
        except Exception:
            log.exception("could not report a broker failure to the client")

    # -- connections and sessions -------------------------------------------------------------

    def _connection_id(self, connection: Connection) -> int:
        existing = getattr(connection, "sb_id", None)
        if isinstance(existing, int):
            return existing
        connection_id = next(self._ids)
        connection.sb_id = connection_id
        self._connections[connection_id] = connection
        self._by_connection[connection_id] = set()
        return connection_id

    @_guarded
    def on_connection_bound(self, event: Event) -> None:
        """Offer SASL ANONYMOUS, which the SDK uses before it sends its token over $cbs.

        PLAIN is not offered: proton's built-in SASL (the PyPI wheel has no Cyrus SASL) cannot serve it,
        and the SDK never uses it.
        """
        if event.transport is not None:
            sasl = event.transport.sasl()
            sasl.allowed_mechs("ANONYMOUS")

    @_guarded
    def on_connection_remote_open(self, event: Event) -> None:
        connection = event.connection
        if connection is not None:
            self._connection_id(connection)
            connection.container = "servicebus-test-broker"
            connection.open()

    @_guarded
    def on_session_remote_open(self, event: Event) -> None:
        if event.session is not None:
            event.session.open()

    @_guarded
    def on_session_remote_close(self, event: Event) -> None:
        if event.session is not None and not event.session.state & Link.LOCAL_CLOSED:
            event.session.close()

    @_guarded
    def on_connection_remote_close(self, event: Event) -> None:
        connection = event.connection
        if connection is not None:
            self._forget_connection(connection)
            if not connection.state & Link.LOCAL_CLOSED:
                connection.close()

    @_guarded
    def on_transport_closed(self, event: Event) -> None:
        if event.connection is not None:
            self._forget_connection(event.connection)

    def _forget_connection(self, connection: Connection) -> None:
        connection_id = getattr(connection, "sb_id", None)
        if not isinstance(connection_id, int):
            return
        for link_id in list(self._by_connection.get(connection_id, ())):
            entry = self._links.get(link_id)
            if entry is not None:
                self._forget_link(entry[1])
        self._by_connection.pop(connection_id, None)
        self._connections.pop(connection_id, None)
        self._pump()

    # -- attach -------------------------------------------------------------------------------

    @_guarded
    def on_link_remote_open(self, event: Event) -> None:
        link = _link_of(event)
        client_sends = link.is_receiver
        address = (link.remote_target if client_sends else link.remote_source).address
        path = entity_path(address)
        connection_id = self._connection_id(link.connection)
        info = LinkInfo(next(self._ids), connection_id, Kind.SEND, link.name, path)
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        try:
            self._classify(link, info, client_sends)
        except BrokerError as err:
            log.info("refusing link %r to %r: %s", link.name, address, err.description)
            self._refuse(link, err.condition, err.description)
            return
        link.sb_info = info
        self._links[info.link_id] = (link, info)
        self._by_connection.setdefault(connection_id, set()).add(info.link_id)
        if info.kind is Kind.RECEIVE:
            self._receivers[info.link_id] = (link, info)
            if info.wants_session and info.session is None:
                self._wait_for_session(link, info)
                return
        if info.session is not None:
            self._open_session_link(link, info)
        else:
            if client_sends:
                link.max_message_size = MAX_MESSAGE_SIZE
            link.open()
        if client_sends:
            link.flow(INCOMING_CREDIT)
        self._pump()

    def _classify(self, link: Link, info: LinkInfo, client_sends: bool) -> None:
        path = info.address
        if path.lower() == "$cbs":
            info.kind = Kind.CBS_REQUESTS if client_sends else Kind.CBS_REPLIES
        elif path.lower().endswith(MANAGEMENT_SUFFIX):
            info.node = self.namespace.node(path[: -len(MANAGEMENT_SUFFIX)])
            info.kind = Kind.MANAGEMENT_REQUESTS if client_sends else Kind.MANAGEMENT_REPLIES
        elif client_sends:
            info.kind = Kind.SEND
            info.target = self.namespace.send_target(path)
        else:
            info.kind = Kind.RECEIVE
            entity = info.entity = self.namespace.receive_source(path)
            info.peek_lock = link.remote_snd_settle_mode != Link.SND_SETTLED
            filters = _filters(link)
            info.wants_session = SESSION_FILTER in filters
            if info.wants_session and not entity.requires_session:
                raise BrokerError(
                    NOT_ALLOWED,
                    f"A sessionful message receiver cannot be created on an entity that does not require sessions: "
                    f"'{entity.path}'. Ensure RequiresSession is set to true when creating a Queue or Subscription "
                    "to enable sessionful behavior.",
                )
            if entity.requires_session and not info.wants_session:
                raise BrokerError(
                    NOT_ALLOWED,
                    f"It is not possible for an entity that requires sessions to create a non-sessionful message "
                    f"receiver: '{entity.path}'.",
                )
            if info.wants_session:
                requested = filters[SESSION_FILTER]
                session_id = None if requested is None else str(requested)
                info.session = entity.sessions.accept(session_id, info, time.time())

    def _refuse(self, link: Link, condition: str, description: str) -> None:
        """Refuse an attach the AMQP way: attach with a null terminus on our side, then detach with the error.

        The null terminus matters to the SDK: it keeps the link from counting as attached, so the
        error is raised by the open itself (e.g. MessagingEntityNotFoundError, SessionCannotBeLockedError)
        instead of surfacing on some later call.
        """
        if link.is_sender:
            link.source.type = Terminus.UNSPECIFIED
        else:
            link.target.type = Terminus.UNSPECIFIED
        link.condition = _condition(condition, description)
        link.close()

    def _wait_for_session(self, link: Link, info: LinkInfo) -> None:
        """Hold the attach of a next-available session receiver until a session has messages."""
        properties = link.remote_properties or {}
        timeout_ms = properties.get(OPERATION_TIMEOUT)
        wait = timeout_ms / 1000.0 if isinstance(timeout_ms, int) and timeout_ms > 0 else DEFAULT_SESSION_WAIT
        info.session_wait_deadline = time.time() + wait

    def _open_session_link(self, link: Link, info: LinkInfo) -> None:
        assert info.session is not None
        link.source.filter.clear()
        link.source.filter.put_dict({SESSION_FILTER: info.session.session_id})
        link.properties = {LOCKED_UNTIL_UTC: _ticks(info.session.locked_until)}
        info.session_wait_deadline = None
        link.open()

    # -- detach -------------------------------------------------------------------------------

    @_guarded
    def on_link_remote_close(self, event: Event) -> None:
        link = _link_of(event)
        info = getattr(link, "sb_info", None)
        if isinstance(info, LinkInfo):
            self._forget_link(info)
        if not link.state & Link.LOCAL_CLOSED:
            link.close()
        self._pump()

    def _forget_link(self, info: LinkInfo) -> None:
        """Drop a link's state. Message locks stay until they expire; a session lock ends now."""
        if info.closed:
            return
        info.closed = True
        self._links.pop(info.link_id, None)
        self._receivers.pop(info.link_id, None)
        self._by_connection.get(info.connection_id, set()).discard(info.link_id)
        if info.session is not None and info.entity is not None:
            info.entity.sessions.release(info.session.session_id, info, time.time())

    def _close_link(self, link: Link, info: LinkInfo, condition: str, description: str) -> None:
        self._forget_link(info)
        link.condition = _condition(condition, description)
        if not link.state & Link.LOCAL_CLOSED:
            link.close()

    # -- flow and deliveries ------------------------------------------------------------------

    @_guarded
    def on_link_flow(self, event: Event) -> None:
        link = _link_of(event)
        info = getattr(link, "sb_info", None)
        if isinstance(info, LinkInfo) and info.pending_replies:
            self._flush_replies(link, info)
        self._pump()

    @_guarded
    def on_delivery(self, event: Event) -> None:
        link = _link_of(event)
        delivery = _delivery_of(event)
        info = getattr(link, "sb_info", None)
        if not isinstance(info, LinkInfo) or info.closed:
            delivery.settle()  # a link we refused or forgot: nothing to apply
            return
        # No error handling may touch the delivery afterwards: once settled, proton frees it.
        try:
            if link.is_receiver:
                self._on_incoming(link, delivery, info)
            else:
                self._on_settlement(delivery, info)
        except Exception:
            log.exception("failed to handle a delivery on %s", info.address)
        self._pump()

    def _on_incoming(self, link: Link, delivery: Delivery, info: LinkInfo) -> None:
        if delivery.aborted:
            delivery.settle()
            return
        if delivery.partial:
            return  # wait for the last frame; proton buffers the rest
        data = link.recv(delivery.pending) or b""
        link.advance()
        if link.credit < INCOMING_CREDIT // 2:
            link.flow(INCOMING_CREDIT - link.credit)
        if info.kind is Kind.SEND:
            self._accept_send(delivery, info, data)
            return
        # A request: accept the transfer; the answer (on the reply link) carries the outcome.
        delivery.update(Disposition.ACCEPTED)
        delivery.settle()
        if info.kind is Kind.CBS_REQUESTS:
            self._answer_cbs(link.connection, data)
        elif info.kind is Kind.MANAGEMENT_REQUESTS:
            self._answer_management(link.connection, info, data)

    def _accept_send(self, delivery: Delivery, info: LinkInfo, data: bytes) -> None:
        assert info.target is not None
        try:
            parsed = wire.parse_message(data)
            batch = wire.unpack_batch(parsed)
            messages = batch if batch is not None else [parsed]
            info.target.intake.send([wire.envelope_of(m) for m in messages], time.time())
        except wire.DecodeError as err:
            self._reject(delivery, DECODE_ERROR, str(err))
        except BrokerError as err:
            self._reject(delivery, err.condition, err.description)
        except Exception:
            log.exception("failed to store a message sent to %s", info.address)
            self._reject(delivery, INTERNAL_ERROR, "The broker failed to store the message.")
        else:
            if not delivery.settled:  # i.e. not pre-settled by the client
                delivery.update(Disposition.ACCEPTED)
            delivery.settle()

    @staticmethod
    def _reject(delivery: Delivery, condition: str, description: str) -> None:
        delivery.local.condition = _condition(condition, description)
        delivery.update(Disposition.REJECTED)
        delivery.settle()

    def _on_settlement(self, delivery: Delivery, info: LinkInfo) -> None:
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
            info.entity.settle(
                token, outcome, time.time(), dead_letter_reason=reason, dead_letter_description=description
            )
        except BrokerError as err:
            delivery.local.condition = _condition(err.condition, err.description)
            delivery.update(Disposition.REJECTED)
        else:
            if state == Disposition.MODIFIED:
                delivery.local.failed = delivery.remote.failed
                delivery.local.undeliverable = delivery.remote.undeliverable
            delivery.update(state)
        delivery.settle()

    # -- sending to receivers -----------------------------------------------------------------

    def _pump(self) -> None:
        """Deliver available messages to every receiver with credit (and hand out waiting sessions)."""
        now = time.time()
        for link, info in list(self._receivers.values()):
            if info.closed or info.entity is None:
                continue
            try:
                if info.session_wait_deadline is not None:
                    info.session = info.entity.sessions.accept(None, info, now)
                    if info.session is None:
                        continue
                    self._open_session_link(link, info)
                self._fill(link, info, now)
            except Exception:
                log.exception("failed to deliver to %s", info.address)
                self._close_link(link, info, INTERNAL_ERROR, "The broker failed to deliver a message.")

    def _fill(self, link: Link, info: LinkInfo, now: float) -> None:
        assert info.entity is not None
        while link.credit > 0:
            message = info.entity.next_message(info, now, peek_lock=info.peek_lock, session=info.session)
            if message is None:
                break
            self._send(link, info, message)
        if link.drain_mode:
            link.drained()  # nothing left to send: give the rest of the credit back, as drain asks

    def _send(self, link: Link, info: LinkInfo, message: StoredMessage) -> None:
        token = message.lock_token
        tag = token.bytes_le if token is not None else uuid.uuid4().bytes_le
        delivery = _new_delivery(link, tag)
        if token is not None:
            delivery.sb_token = token
        link.send(wire.encode_delivery(message, delivering=True, locked_until=message.locked_until))
        link.advance()
        if token is None:
            delivery.settle()  # ReceiveAndDelete: the message is gone already

    # -- request/response nodes ---------------------------------------------------------------

    def _reply_link(self, connection: Connection, kind: Kind, address: str | None) -> tuple[Link, LinkInfo] | None:
        connection_id = self._connection_id(connection)
        fallback = None
        for link_id in self._by_connection.get(connection_id, ()):
            link, info = self._links[link_id]
            if info.kind is not kind or info.closed:
                continue
            if address is None or info.address.lower() == address.lower():
                return link, info
            fallback = fallback or (link, info)
        return fallback

    def _send_reply(self, connection: Connection, kind: Kind, address: str | None, reply: Message) -> None:
        found = self._reply_link(connection, kind, address)
        if found is None:
            log.info("no %s link for a reply to %r; dropping it", kind.value, address)
            return
        link, info = found
        info.pending_replies.append(bytes(reply.encode()))
        self._flush_replies(link, info)

    @staticmethod
    def _flush_replies(link: Link, info: LinkInfo) -> None:
        while info.pending_replies and link.credit > 0:
            delivery = _new_delivery(link, uuid.uuid4().bytes)
            link.send(info.pending_replies.popleft())
            link.advance()
            delivery.settle()

    def _answer_cbs(self, connection: Connection, data: bytes) -> None:
        request = Message()
        request.decode(data)
        reply = Message(
            correlation_id=request.id,
            properties={"status-code": 200, "status-description": "OK"},
        )
        self._send_reply(connection, Kind.CBS_REPLIES, "$cbs", reply)

    def _answer_management(self, connection: Connection, info: LinkInfo, data: bytes) -> None:
        assert info.node is not None
        request = Message()
        request.decode(data)
        properties: dict[str, Any] = request.properties or {}
        operation = str(properties.get("operation", ""))
        associated = properties.get("associated-link-name")
        owner = self._receiver_named(connection, str(associated)) if associated is not None else None
        body = request.body if isinstance(request.body, dict) else {}
        response = management.handle(
            info.node,
            management.Request(
                operation=operation, body={str(k): v for k, v in body.items()}, owner=owner, now=time.time()
            ),
        )
        if response.status_code >= 300:
            log.info("%s on %s: %s %s", operation, info.address, response.status_code, response.description)
        reply_properties: dict[str, Any] = {
            "statusCode": response.status_code,
            "statusDescription": response.description,
        }
        if response.condition is not None:
            reply_properties["errorCondition"] = symbol(response.condition)
        reply = Message(correlation_id=request.id, properties=reply_properties, body=response.body)
        reply_to = entity_path(request.reply_to) if request.reply_to else info.address
        self._send_reply(connection, Kind.MANAGEMENT_REPLIES, reply_to, reply)

    def _receiver_named(self, connection: Connection, name: str) -> LinkInfo | None:
        for link_id in self._by_connection.get(self._connection_id(connection), ()):
            info = self._links[link_id][1]
            if info.kind is Kind.RECEIVE and info.name == name and not info.closed:
                return info
        return None

    # -- timers -------------------------------------------------------------------------------

    def _tick(self, now: float) -> None:
        for lost in self.namespace.tick(now):
            owner = lost.owner
            if isinstance(owner, LinkInfo) and owner.link_id in self._links:
                link = self._links[owner.link_id][0]
                self._close_link(
                    link,
                    owner,
                    SESSION_LOCK_LOST,
                    f"The session lock has expired on the MessageSession '{lost.session_id}'. "
                    "Accept a new MessageSession.",
                )
        for link, info in list(self._receivers.values()):
            if info.session_wait_deadline is not None and now >= info.session_wait_deadline:
                self._forget_link(info)
                self._refuse(
                    link, TIMEOUT, "The operation did not complete within the allocated time: no session is available."
                )
        self._pump()


class _Call(Handler):
    """A one-off timer task that calls a function (proton schedules handlers, not callables)."""

    def __init__(self, function: Callable[[], None]) -> None:
        super().__init__()
        self._function = function

    def on_timer_task(self, event: Event) -> None:
        try:
            self._function()
        except Exception:
            log.exception("scheduled broker task failed")


def _filters(link: Link) -> dict[Any, Any]:
    data = link.remote_source.filter
    data.rewind()
    if not data.next():
        return {}
    value = data.get_object()
    return dict(value) if isinstance(value, dict) else {}


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
        condition = delivery.remote.condition
        info = dict(condition.info or {}) if condition is not None and isinstance(condition.info, dict) else {}
        reason = info.get("DeadLetterReason")
        description = info.get("DeadLetterErrorDescription")
        if description is None and condition is not None:
            description = condition.description
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


class ReactorThreadBroker:
    """Runs a :class:`BrokerHandler` on a proton Container in a background thread."""

    def __init__(self, namespace: Namespace, host: str, port: int) -> None:
        self.handler = BrokerHandler(namespace)
        self.container = Container(self.handler)
        self.handler.container = self.container
        self.handler.acceptor = self.container.acceptor(host, str(port))
        self.host = host
        self.port = _bound_port(self.handler.acceptor)
        injector = EventInjector()
        self.handler.injector = injector
        self.container.selectable(injector)
        self._injector = injector
        self._thread = threading.Thread(target=self._run, name="servicebus-broker", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            self.container.run()
        except BaseException as err:  # keep the reason for whoever stops us
            self.error = err
            log.exception("broker reactor stopped with an error")

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread.is_alive():
            self._injector.trigger(ApplicationEvent("sb_stop"))
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()


def _bound_port(acceptor: Any) -> int:
    """The port the acceptor's socket is bound to (what ``port=0`` resolved to).

    proton's Acceptor does not expose its socket, so this reads it through the selectable's file
    descriptor.
    """
    fileno = acceptor._selectable.fileno()
    with socket.socket(fileno=os.dup(fileno)) as sock:
        return int(sock.getsockname()[1])
