"""Message sections on their own: parsing what clients send, spotting batches, encoding deliveries."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from proton import Data, Described, Message, decimal64, decimal128, symbol, ulong

from devservers.servicebus import decimals, wire
from devservers.servicebus.config import CorrelationFilter
from devservers.servicebus.errors import BrokerError
from devservers.servicebus.server import entity_path
from devservers.servicebus.store import StoredMessage, correlation_matches


def _encoded(**fields: object) -> bytes:
    return bytes(Message(**fields).encode())  # type: ignore[arg-type]


def _data_section(payload: bytes) -> bytes:
    data = Data()
    data.put_object(Described(ulong(wire.DATA), payload))
    return bytes(data.encode())


def test_envelope_reads_routing_fields_ttl_and_schedule() -> None:
    raw = _encoded(
        id="m-1",
        group_id="s-1",
        correlation_id="c",
        subject="invoice",
        ttl=2.5,
        properties={"region": "eu"},
        annotations={symbol("x-opt-scheduled-enqueue-time"): 1_700_000_000_000},
        body=b"payload",
    )
    envelope = wire.envelope_of(wire.parse_message(raw))
    assert (envelope.message_id, envelope.session_id, envelope.correlation_id, envelope.subject) == (
        "m-1",
        "s-1",
        "c",
        "invoice",
    )
    assert envelope.application_properties == {"region": "eu"}
    assert envelope.ttl == 2.5 and envelope.scheduled_enqueue_time == 1_700_000_000.0


def test_batch_is_recognised_by_its_data_sections_holding_whole_messages() -> None:
    inner = [_encoded(body=f"item-{i}") for i in range(3)]
    batch = wire.parse_message(b"".join(_data_section(m) for m in inner))
    unpacked = wire.unpack_batch(batch)
    assert unpacked is not None and len(unpacked) == 3
    assert wire.unpack_batch(wire.parse_message(_encoded(body=b"\x00\x53 not a message"))) is None
    assert wire.unpack_batch(wire.parse_message(_encoded(body="text"))) is None


def test_delivery_keeps_the_body_and_sets_broker_header_and_annotations() -> None:
    parsed = wire.parse_message(_encoded(id="m", body=b"\x01\x02", properties={"k": "v"}))
    stored = StoredMessage(
        envelope=wire.envelope_of(parsed),
        sequence_number=7,
        enqueued_time=1_700_000_000.0,
        ttl=60.0,
        expires_at=1_700_000_060.0,
        delivery_count=2,
        lock_token=uuid.uuid4(),
        locked_until=1_700_000_030.0,
        dead_letter_reason="Because",
    )
    decoded = Message()
    decoded.decode(wire.encode_delivery(stored, delivering=True, locked_until=stored.locked_until))
    assert decoded.body == b"\x01\x02" and decoded.id == "m"
    assert decoded.ttl == 60.0 and decoded.delivery_count == 1  # prior attempts
    assert decoded.annotations is not None
    assert decoded.annotations[symbol("x-opt-sequence-number")] == 7
    assert decoded.annotations[symbol("x-opt-enqueued-time")] == 1_700_000_000_000
    assert decoded.annotations[symbol("x-opt-locked-until")] == 1_700_000_030_000
    assert decoded.properties == {"k": "v", "DeadLetterReason": "Because"}


def test_a_value_body_keyed_by_lists_is_kept_as_sent_and_binary_keys_elsewhere_decode() -> None:
    data = Data()
    data.put_described()
    data.enter()
    data.put_ulong(wire.AMQP_VALUE)
    data.put_map()  # {[1, 2]: "by list", b"k": "by binary"}: legal AMQP, not a Python dict
    data.enter()
    data.put_list()
    data.enter()
    data.put_int(1)
    data.put_int(2)
    data.exit()
    data.put_string("by list")
    data.put_binary(b"k")
    data.put_string("by binary")
    data.exit()
    data.exit()
    body = bytes(data.encode())
    annotations = {symbol("x-opt-nested"): {b"k": b"v"}}
    parsed = wire.parse_message(_encoded(annotations=annotations) + body)  # proton adds no body section
    assert parsed.body_raw == body and parsed.has_other_body
    assert parsed.message_annotations == annotations


def test_decimal_properties_are_kept_in_service_bus_layout_and_filtered_as_numbers() -> None:
    ieee = decimal128(bytes.fromhex("303e000000000000000000000000000f"))  # 1.5, as the SDK encodes it
    parsed = wire.parse_message(_encoded(properties={"price": ieee, "region": "eu"}, body=b"x"))
    assert parsed.application_properties == {"price": decimals.to_service_bus(Decimal("1.5")), "region": "eu"}
    envelope = wire.envelope_of(parsed)
    assert envelope.application_properties == {"price": Decimal("1.5"), "region": "eu"}
    assert correlation_matches(CorrelationFilter(properties={"price": 1.5}), envelope)
    assert not correlation_matches(CorrelationFilter(properties={"price": 2}), envelope)
    with pytest.raises(BrokerError) as refused:
        wire.parse_message(_encoded(properties={"price": decimal64(0x7800_0000_0000_0000)}, body=b"x"))
    assert refused.value.condition == "com.microsoft:argument-out-of-range"


def test_malformed_bytes_raise_decode_error() -> None:
    with pytest.raises(wire.DecodeError):
        wire.parse_message(b"\x00\x53\x77\xa1\x05ab")  # a string cut short
    with pytest.raises(wire.DecodeError):
        wire.parse_message(b"\xa1\x01a")  # not a described section


@pytest.mark.parametrize(
    ("address", "path"),
    [
        ("amqps://127.0.0.1:5672/orders", "orders"),
        ("amqps://host/topic/Subscriptions/sub/$DeadLetterQueue", "topic/Subscriptions/sub/$DeadLetterQueue"),
        ("orders/$management", "orders/$management"),
        ("$cbs", "$cbs"),
        (None, ""),
    ],
)
def test_entity_path_strips_scheme_and_host(address: str | None, path: str) -> None:
    assert entity_path(address) == path
