"""The AMQP side of the broker, on python-qpid-proton's reactor.

One handler serves every connection. It speaks the conventions ``azure-servicebus`` expects of
Service Bus (read from the SDK's source): SASL ANONYMOUS, then a claims-based-security put-token over
the ``$cbs`` link pair; the rest is delegated to the classes that own each concern:

* :class:`routing.LinkRouter` and :class:`routing.LinkTable`: attaching links to entities and nodes
  (sessions included), detaching them, and the table of open connections and links;
* :class:`pump.DeliveryPump`: messages sent to entities, deliveries to receivers within their credit,
  and the settlements of those deliveries;
* :class:`requests.RequestResponder`: the ``$cbs`` and ``$management`` request/response nodes.

Bytes between the sockets and proton pass through :class:`iohandler.TranslatingIOHandler`, which
renumbers delivery-ids the way Service Bus tolerates them (see ``frames.py``).

All broker state is touched only on the reactor thread.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from proton import Delivery, Event, Link
from proton.reactor import ApplicationEvent, Container, EventInjector, Handler

from devservers.servicebus.amqp import INTERNAL_ERROR, Kind, LinkInfo, condition, entity_path, info_of
from devservers.servicebus.iohandler import TranslatingIOHandler
from devservers.servicebus.pump import DeliveryPump
from devservers.servicebus.requests import RequestResponder
from devservers.servicebus.routing import LinkRouter, LinkTable
from devservers.servicebus.store import Namespace

__all__ = ["BrokerHandler", "ReactorThreadBroker", "entity_path"]

log = logging.getLogger("devservers.servicebus")

# The broker ticks when a deadline falls due (a lock, a session lock, a scheduled message, a TTL, a receiver's wait
# for a session), noticing it up to TICK_SECONDS late, and after a message became available; otherwise once every
# IDLE_TICK_SECONDS. On a fixed 20-a-second beat, the ticks of an idle broker serving one host were half its CPU.
TICK_SECONDS = 0.05
IDLE_TICK_SECONDS = 1.0
STOP_GRACE_SECONDS = 0.1


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
        self._bring_tick_forward()

    return wrapper


class BrokerHandler(Handler):
    """proton event handler: turns AMQP events into calls on the router, the pump and the request responder."""

    def __init__(self, namespace: Namespace) -> None:
        super().__init__()
        self.namespace = namespace
        self._links = LinkTable()
        self._router = LinkRouter(namespace, self._links)
        self._pump = DeliveryPump(self._links, self._router)
        self._requests = RequestResponder(self._links)
        self.acceptor: Any = None
        self.injector: EventInjector | None = None
        self.container: Container | None = None
        self._stopping = False
        self._tick_task: Any = None
        self._tick_at = 0.0  # when the next tick is planned (time.time())
        self._ticked_at = 0.0

    # -- lifecycle ----------------------------------------------------------------------------

    @_guarded
    def on_reactor_init(self, event: Event) -> None:
        self._plan_tick(event.container, time.time() + TICK_SECONDS)

    def on_timer_task(self, event: Event) -> None:
        if self._stopping:
            return
        self._ticked_at = now = time.time()
        try:
            self._tick(now)
        except Exception:
            log.exception("broker tick failed")
        self._plan_tick(event.container, self._next_due(now))

    def _next_due(self, now: float) -> float:
        """When the next tick is wanted: the earliest deadline, or at once after a message became available."""
        due = self.namespace.alarm.earliest
        return min(due, now) if self.namespace.made_available else due

    def _plan_tick(self, container: Container, at: float) -> None:
        """Plan the next tick for ``at``, at least TICK_SECONDS after the last and at most IDLE_TICK_SECONDS away."""
        now = time.time()
        delay = min(max(at - now, self._ticked_at + TICK_SECONDS - now, 0.0), IDLE_TICK_SECONDS)
        if self._tick_task is not None:
            self._tick_task.cancel()
        self._tick_at = now + delay
        self._tick_task = container.schedule(delay, self)

    def _bring_tick_forward(self) -> None:
        """After an event: tick sooner if the event added an earlier deadline or made a message available."""
        if self._stopping or self._tick_task is None or self.container is None:
            return
        now = time.time()
        due = self._next_due(now)
        if max(due, self._ticked_at + TICK_SECONDS) < self._tick_at:
            self._plan_tick(self.container, due)

    def _tick(self, now: float) -> None:
        lost = self.namespace.tick(now)
        for session in lost:
            self._router.detach_lost_session(session)
        waits_end = self._router.end_session_waits(now)
        # A pass over every receiver only when time (or anything since the last tick) made a message or a session
        # available: each event that does so runs its own pass as well, and this one catches what a timer did and
        # what a pass already under way went by. Run on every tick, the passes over the idle receivers of a few
        # hosts (20 a second, each receiver asked for a message) were half an idle broker's CPU.
        if lost or self.namespace.take_made_available():
            self._pump.run()
        self.namespace.alarm.reset()
        self.namespace.alarm.at(waits_end)

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
        for connection in self._links.connections():
            if not connection.state & Link.LOCAL_CLOSED:
                connection.close()
        if self.container is not None:
            self.container.schedule(STOP_GRACE_SECONDS, _Call(self._cut_connections))
            self.container.schedule(2 * STOP_GRACE_SECONDS, _Call(self._stop_reactor))

    def _cut_connections(self) -> None:
        for connection in self._links.connections():
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
                info = info_of(link)
                if info is not None:
                    self._links.forget(info)
                link.condition = condition(INTERNAL_ERROR, "The broker failed to process a request on this link.")
                if not link.state & Link.LOCAL_CLOSED:
                    link.close()
            elif event.connection is not None and not event.connection.state & Link.LOCAL_CLOSED:
                event.connection.condition = condition(INTERNAL_ERROR, "The broker failed; closing the connection.")
                event.connection.close()
        except Exception:
            log.exception("could not report a broker failure to the client")

    # -- connections and sessions -------------------------------------------------------------

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
            self._links.connection_id(connection)
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
            if self._links.forget_connection(connection):
                self._pump.run()
            if not connection.state & Link.LOCAL_CLOSED:
                connection.close()

    @_guarded
    def on_transport_closed(self, event: Event) -> None:
        if event.connection is not None and self._links.forget_connection(event.connection):
            self._pump.run()

    # -- links --------------------------------------------------------------------------------

    @_guarded
    def on_link_remote_open(self, event: Event) -> None:
        if self._router.attach(_link_of(event)):
            self._pump.run()

    @_guarded
    def on_link_remote_close(self, event: Event) -> None:
        self._router.detach(_link_of(event))
        self._pump.run()

    @_guarded
    def on_link_flow(self, event: Event) -> None:
        link = _link_of(event)
        info = info_of(link)
        if info is not None and info.pending_replies:
            self._requests.flush(link, info)
        if info is not None and info.kind is Kind.RECEIVE:
            self._pump.fill(link, info)
        else:
            self._pump.run()

    @_guarded
    def on_delivery(self, event: Event) -> None:
        link = _link_of(event)
        delivery = _delivery_of(event)
        info = info_of(link)
        if info is None or info.closed:
            delivery.settle()  # a link we refused or forgot: nothing to apply
            return
        # No error handling may touch the delivery afterwards: once settled, proton frees it.
        try:
            self._route_delivery(link, delivery, info)
        except Exception:
            log.exception("failed to handle a delivery on %s", info.address)
        self._pump.run()

    def _route_delivery(self, link: Link, delivery: Delivery, info: LinkInfo) -> None:
        """A settlement of a delivery we sent, a message sent to an entity, or a request to a node."""
        if link.is_sender:
            self._pump.settle(delivery, info)
            return
        data = self._pump.take(link, delivery)
        if data is None:
            return
        if info.kind is Kind.SEND:
            self._pump.store(delivery, info, data)
        else:
            self._requests.answer(link.connection, delivery, info, data)


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


class ReactorThreadBroker:
    """Runs a :class:`BrokerHandler` on a proton Container in a background thread."""

    def __init__(self, namespace: Namespace, host: str, port: int) -> None:
        self.handler = BrokerHandler(namespace)
        # Transfers are renumbered on their way into proton (see frames.py): the SDK's threads send
        # delivery-ids out of order, which proton would answer by closing the connection.
        self.container = Container(self.handler, global_handler=TranslatingIOHandler())
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
