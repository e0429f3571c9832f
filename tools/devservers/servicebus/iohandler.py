"""proton's socket I/O with a :class:`frames.DeliveryIdTranslator` between each client's socket and its transport.

proton's Python reactor moves the bytes itself (``proton._handlers.IOHandler``: what a socket reads is
``Transport.push``-ed, what the transport has to say is ``peek``-ed and ``pop``-ped into the socket),
so the translation goes there, in a subclass the Container takes as its global handler.

A translated frame can be longer or shorter than proton's, so output leaves proton's buffer as soon
as it is translated and waits in this handler's own buffer until the socket takes it; the selectable
stays writable (and is not torn down) while any of it is left.
"""

from __future__ import annotations

import logging
import select
import time
from typing import Any

from proton import Event, Transport
from proton.handlers import IOHandler

from devservers.servicebus.frames import DeliveryIdTranslator

__all__ = ["TranslatingIOHandler"]

log = logging.getLogger("devservers.servicebus")

#: How long a closing connection may hold the reactor to get its last translated bytes out.
FLUSH_ON_CLOSE_SECONDS = 0.5


class _ConnectionIO:
    """Per accepted socket: its translator and the translated output the socket has not taken yet."""

    def __init__(self) -> None:
        self.translator = DeliveryIdTranslator()
        self.unsent = bytearray()


def _io_of(selectable: Any, *, create: bool = True) -> _ConnectionIO | None:
    io = getattr(selectable, "sb_io", None)  # Selectable delegates unknown attributes to its socket
    if io is None and create:
        io = _ConnectionIO()
        selectable.sb_io = io
    return io if isinstance(io, _ConnectionIO) else None


def _push(transport: Transport, data: bytes) -> None:
    """Give proton all of ``data``; it grows its input buffer as it takes whole frames."""
    view = memoryview(data)
    while view:
        capacity = transport.capacity()
        if capacity <= 0:
            return  # input closed: proton takes nothing more, as with bytes read after a close
        transport.push(bytes(view[:capacity]))
        view = view[capacity:]


def _send(selectable: Any, io: _ConnectionIO) -> None:
    try:
        sent = selectable.send(bytes(io.unsent))
    except BlockingIOError:
        return
    del io.unsent[:sent]


def _flush(selectable: Any, io: _ConnectionIO) -> None:
    """Best effort before the socket goes: wait a little for it to take what is left."""
    deadline = time.monotonic() + FLUSH_ON_CLOSE_SECONDS
    try:
        while io.unsent and time.monotonic() < deadline:
            select.select([], [selectable], [], max(0.0, deadline - time.monotonic()))
            _send(selectable, io)
    except OSError as err:
        log.info("could not send a closing connection's last frames: %r", err)
    io.unsent.clear()


class TranslatingIOHandler(IOHandler):
    """proton's IOHandler, with delivery-ids translated on every accepted connection (see frames.py)."""

    def on_selectable_readable(self, event: Event) -> None:
        selectable: Any = event.selectable
        transport = selectable._transport
        if not transport:
            return  # the acceptor's own socket
        io = _io_of(selectable)
        assert io is not None
        capacity = transport.capacity()
        if capacity > 0:
            try:
                data = selectable.recv(capacity)
            except OSError as err:
                log.info("could not read from a client: %r", err)
                transport.close_tail()
            else:
                if data:
                    _push(transport, io.translator.incoming(data))
                else:
                    self.on_selectable_error(event)  # end of stream
        self.update(transport, selectable, selectable._reactor.now)

    def on_selectable_writable(self, event: Event) -> None:
        selectable: Any = event.selectable
        transport = selectable._transport
        if not transport:
            return
        io = _io_of(selectable)
        assert io is not None
        pending = transport.pending()
        if pending > 0:
            io.unsent += io.translator.outgoing(transport.peek(pending) or b"")
            transport.pop(pending)
        if io.unsent:
            try:
                _send(selectable, io)
            except OSError as err:
                log.info("could not write to a client: %r", err)
                io.unsent.clear()
                transport.close_head()
        self.update(transport, selectable, selectable._reactor.now)

    @staticmethod
    def update(transport: Transport, selectable: Any, now: float) -> None:
        io = _io_of(selectable, create=False)
        if io is not None and io.unsent and transport.closed:
            _flush(selectable, io)  # proton is done with the connection; the socket is about to go
        IOHandler.update(transport, selectable, now)
        if io is not None and io.unsent and not selectable.is_terminal:
            selectable.writing = True
            selectable.update()

    def on_transport_closed(self, event: Event) -> None:
        transport = event.transport
        selectable = getattr(transport, "_selectable", None) if transport is not None else None
        io = _io_of(selectable, create=False) if selectable is not None else None
        if io is not None and io.unsent:
            _flush(selectable, io)
        super().on_transport_closed(event)
