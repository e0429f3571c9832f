"""AMQP message encoding: split a message into its sections, unpack batches, build deliveries.

Messages are kept as their original sections so that what the client sent comes back byte for byte
(bodies, properties) while the broker rewrites only what Service Bus rewrites: the header (time to
live, delivery count), broker annotations (``x-opt-sequence-number``, ``x-opt-enqueued-time``,
``x-opt-locked-until``, ...), and the dead-letter application properties.

Values are decoded and encoded with ``proton.Data``, which keeps AMQP types (symbol, ulong,
timestamp, uuid, ...) so a section round-trips unchanged.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from proton import UNDESCRIBED, Array, Data, Described, decimal128, symbol, timestamp, ubyte, uint, ulong

from devservers.servicebus import decimals
from devservers.servicebus.errors import ARGUMENT_OUT_OF_RANGE, BrokerError
from devservers.servicebus.messages import Envelope, MessageState, StoredMessage

__all__ = [
    "DecodeError",
    "ParsedMessage",
    "decode_value",
    "encode_delivery",
    "encode_value",
    "envelope_of",
    "parse_message",
    "unpack_batch",
]

HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78
_SECTION_NAMES = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES,
    "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE,
    "amqp:amqp-value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}

SEQUENCE_NUMBER = symbol("x-opt-sequence-number")
ENQUEUED_TIME = symbol("x-opt-enqueued-time")
LOCKED_UNTIL = symbol("x-opt-locked-until")
SCHEDULED_ENQUEUE_TIME = symbol("x-opt-scheduled-enqueue-time")
DEAD_LETTER_SOURCE = symbol("x-opt-deadletter-source")
MESSAGE_STATE = symbol("x-opt-message-state")
LOCK_TOKEN = symbol("x-opt-lock-token")
# Set by the broker only: a re-sent received message must not carry its old values.
_BROKER_ANNOTATIONS = {SEQUENCE_NUMBER, ENQUEUED_TIME, LOCKED_UNTIL, DEAD_LETTER_SOURCE, MESSAGE_STATE, LOCK_TOKEN}
_UINT_MAX = 2**32 - 1
_UNDESCRIBED: Any = UNDESCRIBED  # proton's marker for "no descriptor"; its annotations do not admit it


class DecodeError(ValueError):
    """The bytes are not a well-formed AMQP message."""


@dataclass
class ParsedMessage:
    """An AMQP message split into sections; body and footer stay encoded."""

    header: list[Any] = field(default_factory=list)
    message_annotations: dict[Any, Any] = field(default_factory=dict)
    properties: list[Any] = field(default_factory=list)
    properties_raw: bytes = b""
    application_properties: dict[Any, Any] | None = None
    body_raw: bytes = b""
    data_sections: list[bytes] = field(default_factory=list)
    has_other_body: bool = False
    footer_raw: bytes = b""

    def header_field(self, index: int) -> Any:
        return self.header[index] if index < len(self.header) else None

    def property_field(self, index: int) -> Any:
        return self.properties[index] if index < len(self.properties) else None


def decode_value(buffer: bytes) -> tuple[Any, int]:
    """The first AMQP value in ``buffer`` (binary values copied out) and how many bytes it took."""
    data = Data()
    try:
        consumed = data.decode(buffer)
        data.rewind()
        data.next()
        value = _read(data)
    except DecodeError:
        raise
    except Exception as err:  # proton raises DataException and a few others on malformed input
        raise DecodeError(f"malformed AMQP value: {err}") from None
    return value, consumed


def _read(data: Data) -> Any:
    """The value at ``data``'s cursor, as proton's ``get_object`` gives it but with binary copied out.

    ``get_object`` builds maps from proton's memoryviews, which cannot be dict keys: a map with binary
    keys (legal AMQP, e.g. a value body ``{b"k": b"v"}``) would fail to decode. Maps, lists and
    described values are therefore walked here, their binary keys and values made ``bytes``.
    """
    kind = data.type()
    if kind == Data.MAP:
        count = data.get_map()
        data.enter()
        result = {}
        for _ in range(count // 2):
            data.next()
            key = _read(data)
            data.next()
            try:
                result[key] = _read(data)
            except TypeError:  # a list or map as a key: legal AMQP, but not a Python dict key
                raise DecodeError(f"a map key of type {type(key).__name__} is not supported here") from None
        data.exit()
        return result
    if kind == Data.LIST:
        count = data.get_list()
        data.enter()
        items = []
        for _ in range(count):
            data.next()
            items.append(_read(data))
        data.exit()
        return items
    if kind == Data.DESCRIBED:
        data.enter()
        data.next()
        descriptor = _read(data)
        data.next()
        value = _read(data)
        data.exit()
        return Described(descriptor, value)
    return _owned(data.get_object())


def _owned(value: Any) -> Any:
    """Copy binary values out of proton's buffer: its memoryviews die with the Data object."""
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, Array):
        return Array(value.descriptor, value.type, *[_owned(item) for item in value.elements])
    return value


def encode_value(value: Any) -> bytes:
    """``value`` AMQP-encoded, with proton's type mapping (``symbol``, ``ulong``, ``Described``, ...)."""
    data = Data()
    data.put_object(value)
    return bytes(data.encode())


def _section_code(descriptor: Any) -> int:
    if isinstance(descriptor, int):
        return int(descriptor)
    if isinstance(descriptor, str) and descriptor in _SECTION_NAMES:
        return _SECTION_NAMES[descriptor]
    raise DecodeError(f"unknown message section descriptor {descriptor!r}")


def parse_message(raw: bytes) -> ParsedMessage:
    """Split an encoded message into sections; raises DecodeError if it is not an AMQP message."""
    if not raw:
        raise DecodeError("empty message")
    parsed = ParsedMessage()
    position = 0
    while position < len(raw):
        code, content, consumed = _decode_section(raw[position:])
        _add_section(parsed, code, content, raw[position : position + consumed])
        position += consumed
    return parsed


# Sections the broker keeps only as bytes: their content is checked (proton decodes it whole) but not
# turned into Python values, which some legal AMQP (a map keyed by lists, say) could not be.
_ENCODED_ONLY = {DELIVERY_ANNOTATIONS, AMQP_SEQUENCE, AMQP_VALUE, FOOTER}


def _decode_section(buffer: bytes) -> tuple[int, Any, int]:
    """The code, content (None if kept encoded) and size of the message section ``buffer`` starts with."""
    data = Data()
    try:
        consumed = data.decode(buffer)
        data.rewind()
        if consumed <= 0 or data.next() != Data.DESCRIBED:
            raise DecodeError("a message section must be a described value")
        data.enter()
        data.next()
        code = _section_code(_read(data))
        data.next()
        content = None if code in _ENCODED_ONLY else _read(data)
    except DecodeError:
        raise
    except Exception as err:  # proton raises DataException and a few others on malformed input
        raise DecodeError(f"malformed AMQP value: {err}") from None
    return code, content, consumed


def _add_section(parsed: ParsedMessage, code: int, content: Any, chunk: bytes) -> None:
    if code == HEADER:
        parsed.header = _as_list(content)
    elif code == MESSAGE_ANNOTATIONS:
        parsed.message_annotations = _as_dict(content)
    elif code == PROPERTIES:
        parsed.properties = _as_list(content)
        parsed.properties_raw = chunk
    elif code == APPLICATION_PROPERTIES:
        parsed.application_properties = _service_bus_properties(_as_dict(content))
    elif code == DATA:
        if not isinstance(content, bytes):
            raise DecodeError("a data section must hold binary")
        parsed.data_sections.append(content)
        parsed.body_raw += chunk
    elif code in (AMQP_SEQUENCE, AMQP_VALUE):
        parsed.has_other_body = True
        parsed.body_raw += chunk
    elif code == FOOTER:
        parsed.footer_raw = chunk
    elif code != DELIVERY_ANNOTATIONS:  # delivery annotations are hop-by-hop: not kept
        raise DecodeError(f"unknown message section 0x{code:x}")


def _as_list(content: Any) -> list[Any]:
    if content is None:
        return []
    if not isinstance(content, list):
        raise DecodeError("a header or properties section must hold a list")
    return content


def _as_dict(content: Any) -> dict[Any, Any]:
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise DecodeError("an annotations or application-properties section must hold a map")
    return content


def _service_bus_properties(properties: dict[Any, Any]) -> dict[Any, Any]:
    """Application properties as Service Bus keeps them: decimals become System.Decimal (see decimals.py).

    Raises BrokerError (``com.microsoft:argument-out-of-range``) for a decimal Service Bus cannot hold,
    so that the sender is told instead of the message being stored in a form nobody can read.
    """
    if not any(isinstance(value, decimals.AMQP_DECIMALS) for value in properties.values()):
        return properties
    kept = dict(properties)
    for key, value in properties.items():
        if isinstance(value, decimals.AMQP_DECIMALS):
            try:
                kept[key] = decimals.to_service_bus(decimals.from_amqp(value))
            except decimals.UnrepresentableDecimal as err:
                raise BrokerError(
                    ARGUMENT_OUT_OF_RANGE, f"The application property {str(key)!r} cannot be sent: {err}."
                ) from None
    return kept


def unpack_batch(parsed: ParsedMessage) -> list[ParsedMessage] | None:
    """The messages of a batch send, or None if ``parsed`` is an ordinary message.

    The SDK sends a batch as one transfer with message format 0x80013700 whose body is one data
    section per encoded message. proton's Python API does not expose the message format, so a batch
    is recognised by its shape instead: no application properties, data sections only, and every
    data section a complete AMQP message with a body. (An ordinary message whose binary body happens
    to be exactly such an encoded message would be taken for a batch; the SDK never sends one.)
    """
    if parsed.application_properties or parsed.has_other_body or not parsed.data_sections:
        return None
    inner = []
    for payload in parsed.data_sections:
        if len(payload) < 3 or payload[0] != 0x00 or payload[1] != 0x53 or not HEADER <= payload[2] <= FOOTER:
            return None
        try:
            message = parse_message(payload)
        except DecodeError:
            return None
        if not message.body_raw:
            return None
        inner.append(message)
    return inner


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes | memoryview):
        return bytes(value).hex()
    return str(value)


def envelope_of(parsed: ParsedMessage) -> Envelope:
    """What the store routes on, read from the message's properties, header and annotations."""
    ttl_ms = parsed.header_field(2)
    scheduled = parsed.message_annotations.get(SCHEDULED_ENQUEUE_TIME)
    app_properties = {str(key): _routing_value(value) for key, value in (parsed.application_properties or {}).items()}
    return Envelope(
        payload=parsed,
        message_id=_text(parsed.property_field(0)),
        to=_text(parsed.property_field(2)),
        subject=_text(parsed.property_field(3)),
        reply_to=_text(parsed.property_field(4)),
        correlation_id=_text(parsed.property_field(5)),
        content_type=_text(parsed.property_field(6)),
        session_id=_text(parsed.property_field(10)),
        reply_to_session_id=_text(parsed.property_field(12)),
        application_properties=app_properties,
        ttl=ttl_ms / 1000.0 if isinstance(ttl_ms, int) and ttl_ms > 0 else None,
        scheduled_enqueue_time=scheduled / 1000.0 if isinstance(scheduled, int) and scheduled > 0 else None,
    )


def _routing_value(value: Any) -> Any:
    """An application property's value as filters compare it (a decimal as a ``Decimal``)."""
    return decimals.from_service_bus(value) if isinstance(value, decimal128) else value


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def encode_delivery(message: StoredMessage, *, delivering: bool, locked_until: float | None = None) -> bytes:
    """The message as Service Bus delivers it (or returns it from peek / receive-by-sequence-number).

    The header carries the effective TTL and the prior-attempts delivery count (``delivering`` for a
    delivery, as opposed to a peek); ``locked_until`` (for PeekLock deliveries) becomes
    ``x-opt-locked-until``; a dead-lettered message gets its reason and
    description as application properties and ``x-opt-deadletter-source``.
    """
    parsed: ParsedMessage = message.envelope.payload
    ttl_ms = _ms(message.ttl) if message.ttl is not None else None
    header = [
        parsed.header_field(0),  # durable
        ubyte(parsed.header_field(1)) if parsed.header_field(1) is not None else None,  # priority
        uint(ttl_ms) if ttl_ms is not None and 0 < ttl_ms <= _UINT_MAX else None,
        None,  # first-acquirer
        uint(message.header_delivery_count(delivering=delivering)),
    ]
    annotations = {k: v for k, v in parsed.message_annotations.items() if k not in _BROKER_ANNOTATIONS}
    annotations[SEQUENCE_NUMBER] = message.sequence_number
    annotations[ENQUEUED_TIME] = timestamp(_ms(message.enqueued_time))
    if locked_until is not None:
        annotations[LOCKED_UNTIL] = timestamp(_ms(locked_until))
    if message.state is not MessageState.ACTIVE:
        annotations[MESSAGE_STATE] = int(message.state)
    if message.dead_letter_source is not None:
        annotations[DEAD_LETTER_SOURCE] = message.dead_letter_source
    app_properties = parsed.application_properties
    if message.dead_letter_reason is not None or message.dead_letter_description is not None:
        app_properties = dict(app_properties or {})
        if message.dead_letter_reason is not None:
            app_properties["DeadLetterReason"] = message.dead_letter_reason
        if message.dead_letter_description is not None:
            app_properties["DeadLetterErrorDescription"] = message.dead_letter_description
    parts = [
        encode_value(Described(ulong(HEADER), header)),
        encode_value(Described(ulong(MESSAGE_ANNOTATIONS), annotations)),
        parsed.properties_raw,
    ]
    if app_properties is not None:
        parts.append(encode_value(Described(ulong(APPLICATION_PROPERTIES), app_properties)))
    parts += [parsed.body_raw, parsed.footer_raw]
    return b"".join(parts)


def timestamp_array(seconds: list[float]) -> Array:
    """An AMQP array of timestamps (what renew-lock answers in ``expirations``)."""
    return Array(_UNDESCRIBED, Data.TIMESTAMP, *[timestamp(_ms(value)) for value in seconds])


def long_array(values: list[int]) -> Array:
    return Array(_UNDESCRIBED, Data.LONG, *values)


def uuid_list(value: Any) -> list[uuid.UUID]:
    """Lock tokens from a management request (an AMQP array of uuid, or a list)."""
    items = value.elements if isinstance(value, Array) else value
    if not isinstance(items, list | tuple):
        raise ValueError("expected an array of lock tokens")
    return [item if isinstance(item, uuid.UUID) else uuid.UUID(str(item)) for item in items]


def int_list(value: Any) -> list[int]:
    items = value.elements if isinstance(value, Array) else value
    if not isinstance(items, list | tuple):
        raise ValueError("expected an array of sequence numbers")
    return [int(item) for item in items]
