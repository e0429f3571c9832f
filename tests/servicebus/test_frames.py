"""The delivery-id translator on its own: frames in the client's numbering in, proton's out, and back."""

from __future__ import annotations

import struct
from typing import Any

from proton import Data, Described, uint, ulong

from devservers.servicebus import frames
from devservers.servicebus.frames import DeliveryIdTranslator

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
ACCEPTED = Described(ulong(0x24), [])


def _frame(channel: int, code: int, fields: list[Any], payload: bytes = b"") -> bytes:
    data = Data()
    data.put_object(Described(ulong(code), fields))
    body = bytes(data.encode()) + payload
    return struct.pack(">IBBH", 8 + len(body), 2, 0, channel) + body


def _begin(channel: int, remote_channel: int | None = None) -> bytes:
    return _frame(channel, frames.BEGIN, [None if remote_channel is None else uint(remote_channel), uint(0)])


def _transfer(
    channel: int, handle: int, delivery_id: int | None, *, more: bool = False, payload: bytes = b"x"
) -> bytes:
    id_field = None if delivery_id is None else uint(delivery_id)
    return _frame(channel, frames.TRANSFER, [uint(handle), id_field, b"tag", uint(0), False, more], payload)


def _disposition(channel: int, first: int, last: int | None = None) -> bytes:
    return _frame(
        channel, frames.DISPOSITION, [True, uint(first), None if last is None else uint(last), True, ACCEPTED]
    )


def _fields(stream: bytes) -> list[tuple[int, list[Any], bytes]]:
    """(code, fields, payload) of every frame in ``stream``."""
    found = []
    position = 0
    while position < len(stream):
        if stream.startswith(b"AMQP", position):
            position += 8
            continue
        size, offset = struct.unpack_from(">IB", stream, position)
        body = stream[position + offset * 4 : position + size]
        data = Data()
        consumed = data.decode(body)
        performative = data.get_object()
        assert isinstance(performative, Described)
        descriptor: Any = performative.descriptor
        fields: Any = performative.value
        found.append((int(descriptor), list(fields), body[consumed:]))
        position += size
    return found


def _ids(stream: bytes, code: int) -> list[tuple[Any, ...]]:
    if code == frames.TRANSFER:
        return [(fields[1],) for found, fields, _ in _fields(stream) if found == code]
    return [
        (fields[1], fields[2] if len(fields) > 2 else None) for found, fields, _ in _fields(stream) if found == code
    ]


def _opened(translator: DeliveryIdTranslator, client_channel: int = 0, broker_channel: int = 0) -> None:
    translator.incoming(SASL_HEADER + AMQP_HEADER + _begin(client_channel))
    translator.outgoing(AMQP_HEADER + _begin(broker_channel, remote_channel=client_channel))


def test_a_client_that_numbers_its_transfers_in_order_passes_byte_for_byte() -> None:
    translator = DeliveryIdTranslator()
    incoming = SASL_HEADER + AMQP_HEADER + _begin(0) + b"".join(_transfer(0, 1, n) for n in range(5))
    outgoing = AMQP_HEADER + _begin(0, remote_channel=0) + _disposition(0, 0, 4)
    assert translator.incoming(incoming) == incoming
    assert translator.outgoing(outgoing) == outgoing


def test_repeated_and_skipped_ids_are_renumbered_and_dispositions_name_the_clients_ids() -> None:
    translator = DeliveryIdTranslator()
    _opened(translator)
    # Two threads sent id 1 and the client's counter lost an increment: its next transfer is 2 again.
    sent = translator.incoming(_transfer(0, 1, 0) + _transfer(0, 1, 1) + _transfer(0, 1, 1) + _transfer(0, 1, 2))
    assert _ids(sent, frames.TRANSFER) == [(0,), (1,), (2,), (3,)]
    assert [payload for _, _, payload in _fields(sent)] == [b"x"] * 4  # payloads untouched
    answered = translator.outgoing(_disposition(0, 0, 3))  # proton settles its 0-3 in one range
    assert _ids(answered, frames.DISPOSITION) == [(0, 1), (1, 2)]
    assert all(fields[3] is True and fields[4] == ACCEPTED for _, fields, _ in _fields(answered))


def test_an_earlier_id_after_a_later_one_is_taken_as_the_next_delivery() -> None:
    translator = DeliveryIdTranslator()
    _opened(translator)
    sent = translator.incoming(_transfer(0, 1, 5) + _transfer(0, 1, 7) + _transfer(0, 1, 6))
    assert _ids(sent, frames.TRANSFER) == [(5,), (6,), (7,)]
    assert _ids(translator.outgoing(_disposition(0, 6)), frames.DISPOSITION) == [(7, None)]
    assert _ids(translator.outgoing(_disposition(0, 7)), frames.DISPOSITION) == [(6, None)]
    assert _ids(translator.outgoing(_disposition(0, 5)), frames.DISPOSITION) == [(5, None)]


def test_continuation_frames_keep_their_deliverys_id() -> None:
    translator = DeliveryIdTranslator()
    _opened(translator)
    sent = translator.incoming(
        _transfer(0, 1, 0)
        + _transfer(0, 2, 0, more=True)  # a repeated id starts a multi-frame delivery on link 2
        + _transfer(0, 1, 1)  # another link's delivery in between
        + _transfer(0, 2, 0, more=True)
        + _transfer(0, 2, None)  # last frame, without an id
    )
    assert _ids(sent, frames.TRANSFER) == [(0,), (1,), (2,), (1,), (None,)]


def test_frames_cut_anywhere_by_the_socket_come_out_whole_and_the_same() -> None:
    stream = _transfer(0, 1, 0) + _transfer(0, 1, 0) + _transfer(0, 1, 1, payload=b"y" * 300)
    whole = DeliveryIdTranslator()
    _opened(whole)
    expected = whole.incoming(stream)
    cut = DeliveryIdTranslator()
    _opened(cut)
    pieces = [cut.incoming(stream[index : index + 1]) for index in range(len(stream))]
    assert b"".join(pieces) == expected
    assert all(not piece or _fields(piece) for piece in pieces)  # only whole frames are handed on


def test_the_brokers_channel_is_mapped_to_the_clients_session() -> None:
    translator = DeliveryIdTranslator()
    _opened(translator, client_channel=3, broker_channel=0)
    translator.incoming(_transfer(3, 1, 0) + _transfer(3, 1, 0))
    assert _ids(translator.outgoing(_disposition(0, 1)), frames.DISPOSITION) == [(0, None)]


def test_dispositions_for_deliveries_the_broker_sent_are_left_alone() -> None:
    translator = DeliveryIdTranslator()
    _opened(translator)
    translator.incoming(_transfer(0, 1, 0) + _transfer(0, 1, 0))
    as_sender = _frame(0, frames.DISPOSITION, [False, uint(1), None, True, ACCEPTED])
    assert translator.outgoing(as_sender) == as_sender


def test_a_new_session_on_the_same_channel_starts_afresh() -> None:
    translator = DeliveryIdTranslator()
    _opened(translator)
    translator.incoming(_transfer(0, 1, 0) + _transfer(0, 1, 0))
    translator.outgoing(_frame(0, frames.END, []))
    translator.incoming(_frame(0, frames.END, []) + _begin(0))
    translator.outgoing(_begin(0, remote_channel=0))
    sent = translator.incoming(_transfer(0, 1, 10) + _transfer(0, 1, 11))
    assert _ids(sent, frames.TRANSFER) == [(10,), (11,)]


def test_bytes_that_are_not_amqp_frames_pass_through_for_proton_to_refuse() -> None:
    translator = DeliveryIdTranslator()
    garbage = b"\x00\x00\x00\x02garbage-that-is-no-frame"
    assert translator.incoming(garbage) == garbage
    assert translator.incoming(_transfer(0, 1, 0)) == _transfer(0, 1, 0)
