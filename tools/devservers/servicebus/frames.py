"""Delivery-ids as Service Bus takes them: in whatever order the client numbers its transfers.

AMQP numbers the transfers of a session with delivery-ids, one more each time; proton's engine
(``pn_do_transfer`` in ``transport.c``, 0.40.0) checks that every new delivery carries exactly the next
id and otherwise closes the connection with ``amqp:session:invalid-field`` ("sequencing error,
expected delivery-id 4, got 3"). The check is unconditional: no proton setting turns it off.

The SDK (azure-servicebus 7.15, ``_pyamqp``) breaks that rule when threads share a connection:
``Session._outgoing_transfer`` reads ``next_outgoing_id``, sends, and only then increments it, with no
lock (nor is ``SenderLink.send_transfer`` locked), so two threads renewing locks or peeking through
one receiver's ``$management`` link send the same delivery-id (and delivery-tag) twice, and the counter
can lose an increment. Service Bus (Microsoft.Azure.Amqp, ``AmqpSession.OnReceiveDelivery``) takes the
client's delivery-id as given and answers dispositions with it.

:class:`DeliveryIdTranslator` does the same in front of proton, on the bytes of one connection:

* incoming: every new delivery of a session gets the delivery-id proton expects; the client's id is
  remembered where it differs (continuation frames of a multi-frame delivery keep its id);
* outgoing: the broker's dispositions for deliveries the client sent name the client's ids again
  (a range is split where the client's ids are not consecutive).

Frames are rewritten only when the ids differ, so a well-behaved client's bytes pass untouched. The
client's own dispositions (``role`` = sender) for its transfers are not translated: the SDK sends none.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from proton import Described, uint

from devservers.servicebus.wire import DecodeError, decode_value, encode_value

__all__ = ["DeliveryIdTranslator"]

_PROTOCOL_HEADER = b"AMQP"
_HEADER_SIZE = 8
_FRAME_HEADER = struct.Struct(">IBBH")  # size, data offset (in 4-byte words), type, channel
_AMQP_FRAME = 0x00
_SERIAL = 2**32  # delivery-ids are RFC 1982 serial numbers

BEGIN = 0x11
ATTACH = 0x12
TRANSFER = 0x14
DISPOSITION = 0x15
DETACH = 0x16
END = 0x17
_NAMES = {
    "amqp:begin:list": BEGIN,
    "amqp:attach:list": ATTACH,
    "amqp:transfer:list": TRANSFER,
    "amqp:disposition:list": DISPOSITION,
    "amqp:detach:list": DETACH,
    "amqp:end:list": END,
}
#: How many client ids one session remembers for deliveries not yet settled by the broker.
MAX_REMEMBERED = 65536
#: Longest disposition range that is translated id by id (proton coalesces settled deliveries).
MAX_RANGE = 65536


@dataclass
class _Session:
    """What one client session's transfers need: proton's next id and the client's ids that differ."""

    next_id: int | None = None  # None until the session's first transfer (proton starts from its id)
    client_ids: dict[int, int] = field(default_factory=dict)  # proton's id -> the client's, where they differ
    ongoing: dict[int, int] = field(default_factory=dict)  # link handle -> proton's id of a multi-frame delivery


class _FrameSplitter:
    """Cuts a byte stream into protocol headers and whole frames; ``broken`` once it stops making sense."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.broken = False

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        units: list[bytes] = []
        position = 0
        while not self.broken:
            size = self._next_size(position)
            if size is None or len(self._buffer) - position < size:
                break
            units.append(bytes(self._buffer[position : position + size]))
            position += size
        del self._buffer[:position]  # once per feed: a burst of many frames is not copied over and over
        if self.broken:  # hand the rest over as it is and let proton judge it
            units.append(bytes(self._buffer))
            self._buffer.clear()
        return units

    def _next_size(self, position: int) -> int | None:
        if len(self._buffer) - position < _HEADER_SIZE:
            return None
        if self._buffer.startswith(_PROTOCOL_HEADER, position):
            return _HEADER_SIZE
        size, offset, _, _ = _FRAME_HEADER.unpack_from(self._buffer, position)
        if size < _HEADER_SIZE or offset < 2 or offset * 4 > size:
            self.broken = True
            return None
        return int(size)


@dataclass
class _Frame:
    channel: int
    code: int
    fields: list[Any]
    descriptor: Any
    payload: bytes

    def encode(self) -> bytes:
        body = encode_value(Described(self.descriptor, self.fields)) + self.payload
        return _FRAME_HEADER.pack(_HEADER_SIZE + len(body), 2, _AMQP_FRAME, self.channel) + body


def _performative_code(body: bytes) -> int | None:
    """The descriptor code of a frame body's performative, read from its first bytes without decoding it."""
    if len(body) >= 3 and body[0] == 0x00 and body[1] == 0x53:  # described, smallulong descriptor
        return body[2]
    if len(body) >= 10 and body[0] == 0x00 and body[1] == 0x80:  # described, ulong descriptor
        return int.from_bytes(body[2:10], "big")
    if len(body) >= 3 and body[0] == 0x00 and body[1] == 0xA3:  # described, sym8 descriptor
        return _NAMES.get(body[3 : 3 + body[2]].decode("ascii", "replace"))
    return None


def _decode_frame(unit: bytes) -> _Frame | None:
    """An AMQP frame with a performative we translate, decoded; None for anything else."""
    size, offset, frame_type, channel = _FRAME_HEADER.unpack_from(unit)
    body = unit[offset * 4 : size]
    if frame_type != _AMQP_FRAME or not body or _performative_code(body) not in _NAMES.values():
        return None
    try:
        performative, consumed = decode_value(body)
    except DecodeError:
        return None  # proton will say what is wrong with it
    if not isinstance(performative, Described) or not isinstance(performative.value, list):
        return None
    code = _performative_code(body)
    assert code is not None
    return _Frame(channel, code, performative.value, performative.descriptor, body[consumed:])


def _field(fields: list[Any], index: int) -> Any:
    return fields[index] if index < len(fields) else None


class DeliveryIdTranslator:
    """Translates the delivery-ids of one connection between the client's numbering and proton's."""

    def __init__(self) -> None:
        self._incoming = _FrameSplitter()
        self._outgoing = _FrameSplitter()
        self._sessions: dict[int, _Session] = {}  # by the client's channel
        self._client_channels: dict[int, int] = {}  # the broker's channel -> the client's

    # -- client to broker ---------------------------------------------------------------------

    def incoming(self, data: bytes) -> bytes:
        """Bytes from the client, with every new delivery numbered as proton expects; whole frames only."""
        return b"".join(self._incoming_unit(unit) for unit in self._incoming.feed(data))

    def _incoming_unit(self, unit: bytes) -> bytes:
        if self._incoming.broken or unit.startswith(_PROTOCOL_HEADER):
            return unit
        frame = _decode_frame(unit)
        if frame is None:
            return unit
        if frame.code == BEGIN:
            self._sessions[frame.channel] = _Session()
        elif frame.code in (ATTACH, DETACH):
            session = self._sessions.get(frame.channel)
            handle = _field(frame.fields, 1 if frame.code == ATTACH else 0)
            if session is not None and handle is not None:
                session.ongoing.pop(int(handle), None)
        elif frame.code == TRANSFER:
            return self._incoming_transfer(frame, unit)
        return unit

    def _incoming_transfer(self, frame: _Frame, unit: bytes) -> bytes:
        session = self._sessions.get(frame.channel)
        handle = _field(frame.fields, 0)
        client_id = _field(frame.fields, 1)
        if session is None or handle is None:
            return unit  # not a transfer proton accepts anyway
        handle = int(handle)
        proton_id = session.ongoing.get(handle)
        if proton_id is None:  # the first frame of a new delivery
            if client_id is None:
                if session.next_id is None:
                    return unit  # proton refuses an initial transfer without an id
                proton_id = session.next_id  # proton numbers it itself
            else:
                proton_id = int(client_id) if session.next_id is None else session.next_id
            session.next_id = (proton_id + 1) % _SERIAL
            if client_id is not None and int(client_id) != proton_id and not _field(frame.fields, 4):
                _remember(session.client_ids, proton_id, int(client_id))  # settled ones get no disposition
        if _field(frame.fields, 5) and not _field(frame.fields, 9):  # more, and not aborted
            session.ongoing[handle] = proton_id
        else:
            session.ongoing.pop(handle, None)
        if client_id is None or int(client_id) == proton_id:
            return unit
        frame.fields[1] = uint(proton_id)
        return frame.encode()

    # -- broker to client ---------------------------------------------------------------------

    def outgoing(self, data: bytes) -> bytes:
        """Bytes from proton, with dispositions naming the client's delivery-ids; whole frames only."""
        return b"".join(self._outgoing_unit(unit) for unit in self._outgoing.feed(data))

    def _outgoing_unit(self, unit: bytes) -> bytes:
        if self._outgoing.broken or unit.startswith(_PROTOCOL_HEADER) or not self._sessions:
            return unit
        size, offset, frame_type, channel = _FRAME_HEADER.unpack_from(unit)
        code = _performative_code(unit[offset * 4 : size]) if frame_type == _AMQP_FRAME else None
        if code not in (BEGIN, END, DISPOSITION):
            return unit  # transfers and flows are most of the traffic: left undecoded
        if code == DISPOSITION:
            session = self._sessions.get(self._client_channels.get(channel, -1))
            if session is None or not session.client_ids:
                return unit
        frame = _decode_frame(unit)
        if frame is None:
            return unit
        if frame.code == BEGIN:
            remote_channel = _field(frame.fields, 0)
            if remote_channel is not None:
                self._client_channels[frame.channel] = int(remote_channel)
        elif frame.code == END:
            client_channel = self._client_channels.pop(frame.channel, None)
            if client_channel is not None:
                self._sessions.pop(client_channel, None)
        elif frame.code == DISPOSITION:
            return self._outgoing_disposition(frame, unit)
        return unit

    def _outgoing_disposition(self, frame: _Frame, unit: bytes) -> bytes:
        if _field(frame.fields, 0) is not True:  # role sender: about deliveries the broker sent
            return unit
        session = self._sessions[self._client_channels[frame.channel]]
        first = int(frame.fields[1])
        last = _field(frame.fields, 2)
        count = (int(last) - first) % _SERIAL + 1 if last is not None else 1
        if count > MAX_RANGE:
            return unit
        proton_ids = [(first + step) % _SERIAL for step in range(count)]
        client_ids = [session.client_ids.get(proton_id, proton_id) for proton_id in proton_ids]
        if _field(frame.fields, 3):  # settled: the broker is done with these deliveries
            for proton_id in proton_ids:
                session.client_ids.pop(proton_id, None)
        if client_ids == proton_ids:
            return unit
        runs: list[list[int]] = []  # [first, last] in the client's numbering
        for client_id in client_ids:
            if runs and client_id == (runs[-1][1] + 1) % _SERIAL:
                runs[-1][1] = client_id
            else:
                runs.append([client_id, client_id])
        frames = []
        for run_first, run_last in runs:
            fields = list(frame.fields) + [None] * (3 - len(frame.fields))
            fields[1] = uint(run_first)
            fields[2] = uint(run_last) if run_last != run_first else None
            frames.append(_Frame(frame.channel, frame.code, fields, frame.descriptor, frame.payload).encode())
        return b"".join(frames)


def _remember(client_ids: dict[int, int], proton_id: int, client_id: int) -> None:
    client_ids[proton_id] = client_id
    if len(client_ids) > MAX_REMEMBERED:  # deliveries never settled by the broker: forget the oldest
        del client_ids[next(iter(client_ids))]
