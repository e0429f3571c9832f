"""Link routing: which entity or node each attached link serves, and the table of open links.

Entities are addressed by full URI (``amqps://host:port/orders``); request/response nodes by path
(``orders/$management``, ``$cbs``). Session receivers ask for a session in the source filter
``com.microsoft:session-filter`` (an id, or null for the next available one); the attach is answered
with the chosen id in the same filter and ``com.microsoft:locked-until-utc`` (.NET ticks) in the link
properties. With no session available, the attach is held until one is, or until the link's
``com.microsoft:timeout`` ends it with the ``com.microsoft:timeout`` error (the SDK's
OperationTimeoutError).
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Any

from proton import Connection, Link, Terminus, symbol

from devservers.servicebus import requestlog
from devservers.servicebus.amqp import INCOMING_CREDIT, Kind, LinkInfo, condition, entity_path, info_of
from devservers.servicebus.config import DEFAULT_MAX_MESSAGE_SIZE
from devservers.servicebus.errors import NOT_ALLOWED, TIMEOUT, BrokerError, session_lock_lost
from devservers.servicebus.store import Namespace, Queue, ReceivableEntity, SessionLockExpired, Topic

__all__ = ["LinkRouter", "LinkTable"]

SESSION_FILTER = symbol("com.microsoft:session-filter")
LOCKED_UNTIL_UTC = symbol("com.microsoft:locked-until-utc")
OPERATION_TIMEOUT = symbol("com.microsoft:timeout")
#: .NET ticks (100 ns) at the Unix epoch: Service Bus's locked-until-utc is a .NET DateTime.
DOTNET_EPOCH_TICKS = 621355968000000000
DEFAULT_SESSION_WAIT = 60.0  # Service Bus's default operation timeout when the link names none
MANAGEMENT_SUFFIX = "/$management"


class LinkTable:
    """Every open connection and attached link, by id (connections and links share one counter)."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._links: dict[int, tuple[Link, LinkInfo]] = {}
        self._by_connection: dict[int, set[int]] = {}
        self._connections: dict[int, Connection] = {}
        self._receivers: dict[int, tuple[Link, LinkInfo]] = {}

    def connection_id(self, connection: Connection) -> int:
        """The connection's id, registering it when first seen."""
        existing = getattr(connection, "sb_id", None)
        if isinstance(existing, int):
            return existing
        connection_id = next(self._ids)
        connection.sb_id = connection_id
        self._connections[connection_id] = connection
        self._by_connection[connection_id] = set()
        return connection_id

    def connections(self) -> list[Connection]:
        """Every connection not yet forgotten."""
        return list(self._connections.values())

    def new_info(self, link: Link, path: str) -> LinkInfo:
        """Fresh state for a link being attached to ``path``, with its own id."""
        connection_id = self.connection_id(link.connection)
        return LinkInfo(next(self._ids), connection_id, Kind.SEND, link.name, path)

    def add(self, link: Link, info: LinkInfo) -> None:
        """Record an accepted link."""
        link.sb_info = info
        self._links[info.link_id] = (link, info)
        self._by_connection.setdefault(info.connection_id, set()).add(info.link_id)
        if info.kind is Kind.RECEIVE:
            self._receivers[info.link_id] = (link, info)

    def link(self, info: LinkInfo) -> Link | None:
        """The link ``info`` describes, while it is recorded."""
        entry = self._links.get(info.link_id)
        return None if entry is None else entry[0]

    def links_on(self, connection: Connection) -> list[tuple[Link, LinkInfo]]:
        """The links recorded on ``connection``."""
        return [self._links[link_id] for link_id in self._by_connection.get(self.connection_id(connection), ())]

    def receivers(self) -> list[tuple[Link, LinkInfo]]:
        """Every recorded receiver link, in the order they attached."""
        return list(self._receivers.values())

    def forget(self, info: LinkInfo, *, closed_by_client: bool = False) -> None:
        """Drop a link's state. Message locks stay until they expire; a session lock ends now. The messages
        it held come back uncounted when the client closed the link, counted otherwise (a connection lost:
        on Service Bus the session lock would run out, which counts; here it ends at once)."""
        if info.closed:
            return
        info.closed = True
        self._links.pop(info.link_id, None)
        self._receivers.pop(info.link_id, None)
        self._by_connection.get(info.connection_id, set()).discard(info.link_id)
        if info.session is not None and info.entity is not None:
            info.entity.sessions.release(info.session.session_id, info, time.time(), expired=not closed_by_client)

    def forget_connection(self, connection: Connection) -> bool:
        """Drop a connection and every link on it; False if it was never registered."""
        connection_id = getattr(connection, "sb_id", None)
        if not isinstance(connection_id, int):
            return False
        for link_id in list(self._by_connection.get(connection_id, ())):
            entry = self._links.get(link_id)
            if entry is not None:
                self.forget(entry[1])
        self._by_connection.pop(connection_id, None)
        self._connections.pop(connection_id, None)
        return True


class LinkRouter:
    """Answers attaches and ends links: routes each link to its entity or node, or refuses it."""

    def __init__(self, namespace: Namespace, table: LinkTable) -> None:
        self._namespace = namespace
        self._table = table

    def attach(self, link: Link) -> bool:
        """Answer a client's attach: open the link, hold it until a session is free, or refuse it; True if open."""
        client_sends = link.is_receiver
        address = (link.remote_target if client_sends else link.remote_source).address
        info = self._table.new_info(link, entity_path(address))
        _mirror(link)
        try:
            self._classify(link, info, client_sends)
        except BrokerError as err:
            requestlog.refused(f"attach {'sender' if client_sends else 'receiver'}", info.address, err.condition,
                               err.description)
            _refuse(link, err.condition, err.description)
            return False
        self._table.add(link, info)
        if info.wants_session and info.session is None:
            _wait_for_session(link, info)
            assert info.session_wait_deadline is not None
            self._namespace.alarm.at(info.session_wait_deadline)  # the tick ends the wait then
            return False
        self._open(link, info, client_sends)
        return True

    def _open(self, link: Link, info: LinkInfo, client_sends: bool) -> None:
        if info.session is not None:
            self.open_session_link(link, info)
        else:
            if client_sends:
                link.max_message_size = _max_message_size(info)
            link.open()
            _log_attach(info)
        if client_sends:
            link.flow(INCOMING_CREDIT)

    def open_session_link(self, link: Link, info: LinkInfo) -> None:
        """Open a session receiver's link, naming the session it got and until when it holds it."""
        assert info.session is not None
        link.source.filter.clear()
        link.source.filter.put_dict({SESSION_FILTER: info.session.session_id})
        link.properties = {LOCKED_UNTIL_UTC: _ticks(info.session.locked_until)}
        info.session_wait_deadline = None
        link.open()
        _log_attach(info)

    def detach(self, link: Link) -> None:
        """The client detached ``link``: forget it and close our end."""
        info = info_of(link)
        if info is not None:
            self._table.forget(info, closed_by_client=True)
        if not link.state & Link.LOCAL_CLOSED:
            link.close()

    def close(self, link: Link, info: LinkInfo, condition_name: str, description: str) -> None:
        """Detach ``link`` from our side with an error."""
        self._table.forget(info)
        link.condition = condition(condition_name, description)
        if not link.state & Link.LOCAL_CLOSED:
            link.close()

    def detach_lost_session(self, lost: SessionLockExpired) -> None:
        """Detach the receiver whose session lock ran out, with session-lock-lost."""
        owner = lost.owner
        if not isinstance(owner, LinkInfo):
            return
        link = self._table.link(owner)
        if link is not None:
            error = session_lock_lost(lost.session_id)
            self.close(link, owner, error.condition, error.description)

    def end_session_waits(self, now: float) -> float:
        """Refuse, with the timeout error, the session receivers whose wait for a session ran out; when the first of
        the other waits runs out (infinity when none waits)."""
        first = math.inf
        for link, info in self._table.receivers():
            if info.session_wait_deadline is None:
                continue
            if now >= info.session_wait_deadline:
                self._table.forget(info)
                _refuse(
                    link, TIMEOUT, "The operation did not complete within the allocated time: no session is available."
                )
            else:
                first = min(first, info.session_wait_deadline)
        return first

    def _classify(self, link: Link, info: LinkInfo, client_sends: bool) -> None:
        path = info.address
        if path.lower() == "$cbs":
            info.kind = Kind.CBS_REQUESTS if client_sends else Kind.CBS_REPLIES
        elif path.lower().endswith(MANAGEMENT_SUFFIX):
            info.node = self._namespace.node(path[: -len(MANAGEMENT_SUFFIX)])
            info.kind = Kind.MANAGEMENT_REQUESTS if client_sends else Kind.MANAGEMENT_REPLIES
        elif client_sends:
            info.kind = Kind.SEND
            info.target = self._namespace.send_target(path)
        else:
            info.kind = Kind.RECEIVE
            info.entity = self._namespace.receive_source(path)
            info.peek_lock = link.remote_snd_settle_mode != Link.SND_SETTLED
            self._ask_for_session(link, info, info.entity)

    def _ask_for_session(self, link: Link, info: LinkInfo, entity: ReceivableEntity) -> None:
        """Take the session a receiver's filter names, or the next available one (None: it waits)."""
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


def _max_message_size(info: LinkInfo) -> int:
    """What a link the client sends on advertises: its queue's or topic's limit, which the SDK sizes batches from."""
    entity = info.target if info.target is not None else info.node
    if isinstance(entity, Queue | Topic):
        return entity.intake.max_message_size
    return DEFAULT_MAX_MESSAGE_SIZE


def _log_attach(info: LinkInfo) -> None:
    """A request log line for a sender or receiver on an entity (not for the $cbs and $management pairs)."""
    if info.kind is Kind.SEND:
        requestlog.attached("sender", info.address)
    elif info.kind is Kind.RECEIVE:
        mode = "peek-lock" if info.peek_lock else "receive-and-delete"
        session = f", session {info.session.session_id}" if info.session is not None else ""
        requestlog.attached("receiver", info.address, mode + session)


def _mirror(link: Link) -> None:
    """Our end of a link takes the client's source, target and settle modes."""
    link.source.copy(link.remote_source)
    link.target.copy(link.remote_target)
    link.snd_settle_mode = link.remote_snd_settle_mode
    link.rcv_settle_mode = link.remote_rcv_settle_mode


def _refuse(link: Link, condition_name: str, description: str) -> None:
    """Refuse an attach the AMQP way: attach with a null terminus on our side, then detach with the error.

    The null terminus matters to the SDK: it keeps the link from counting as attached, so the
    error is raised by the open itself (e.g. MessagingEntityNotFoundError, SessionCannotBeLockedError)
    instead of surfacing on some later call.
    """
    if link.is_sender:
        link.source.type = Terminus.UNSPECIFIED
    else:
        link.target.type = Terminus.UNSPECIFIED
    link.condition = condition(condition_name, description)
    link.close()


def _wait_for_session(link: Link, info: LinkInfo) -> None:
    """Hold the attach of a next-available session receiver until a session has messages."""
    properties = link.remote_properties or {}
    timeout_ms = properties.get(OPERATION_TIMEOUT)
    wait = timeout_ms / 1000.0 if isinstance(timeout_ms, int) and timeout_ms > 0 else DEFAULT_SESSION_WAIT
    info.session_wait_deadline = time.time() + wait


def _ticks(seconds: float) -> int:
    return DOTNET_EPOCH_TICKS + round(seconds * 10_000_000)


def _filters(link: Link) -> dict[Any, Any]:
    data = link.remote_source.filter
    data.rewind()
    if not data.next():
        return {}
    value = data.get_object()
    return dict(value) if isinstance(value, dict) else {}
