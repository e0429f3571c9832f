r"""Field rules shared by the message models, declared as annotated types, and the one decode step.

Decoding is strict (msgspec): a JSON integer is not a string, ``2.0`` is not an integer, a boolean is
not a number. A broken rule becomes InvalidMessage whose text names the rule and the field path, such
as ``Expected `int` >= 1 - at `$.items[0].quantity```, and never the value. Decoding stops at the
first broken rule, so the description names that one. Patterns end in ``\Z`` (Python's ``$`` would
let a trailing newline through); the JSON Schemas spell it ``$``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, TypeVar

import msgspec

from idempotent_consumer.errors import InvalidMessage, LimitExceeded

# A message on Service Bus Standard is at most 256 KB, header and properties included; Premium takes more. The
# app takes a body of at most 256 KB whatever the tier, which keeps an order's documents far inside Cosmos
# DB's 2 MB (docs/design.md, "Limits"); a larger one is LimitExceeded.
MAX_BODY_BYTES = 256 * 1024
BODY_LIMIT = f"this app's message body: {MAX_BODY_BYTES} bytes (Service Bus Standard's 256 KB message)"
# Cosmos DB stores numbers as IEEE 754 doubles: larger integers would not round-trip exactly.
MAX_EXACT_INTEGER = 2**53 - 1
MAX_INTEGER_DIGITS = 18
MAX_FRACTION_DIGITS = 10
MAX_TIMESTAMP_CHARS = 64

Text = Annotated[str, msgspec.Meta(min_length=1, max_length=1024, pattern=r"\S", description="A non-empty string.")]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=255, pattern=r"\S", description="A non-empty string.")]
# An order's id is the OrderPlaced message's MessageId and, on the events' queue, its events' SessionId:
# Service Bus takes at most 128 characters for either. It is also a Cosmos DB id (at most 255) and the
# partition key (at most 2 KB): 128 characters are at most 512 bytes.
MAX_ORDER_ID_CHARS = 128
OrderId = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_ORDER_ID_CHARS,
        pattern=r"^(?=[\s\S]*\S)[^/\\?#]+\Z",
        description="A legal Service Bus MessageId and SessionId and Cosmos DB id: 1 to 128 characters, not only"
                    " spaces, none of / \\ ? #.",
    ),
]
Money = Annotated[
    str,
    msgspec.Meta(
        pattern=rf"^[0-9]{{1,{MAX_INTEGER_DIGITS}}}(\.[0-9]{{1,{MAX_FRACTION_DIGITS}}})?\Z",
        description="A decimal string such as \"19.99\": at least 0, at most 18 integer and 10 fraction digits.",
    ),
]
Currency = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z]{3}\Z", description="Three ASCII letters, such as EUR.")]
Timestamp = Annotated[
    str,
    msgspec.Meta(
        min_length=1, max_length=MAX_TIMESTAMP_CHARS, description="An ISO 8601 timestamp with a time-zone offset."
    ),
]

T = TypeVar("T")


def decode(body: bytes | None, model: type[T]) -> T:
    """Decode a UTF-8 JSON body of at most 256 KB into ``model``, or raise InvalidMessage naming the rule
    (LimitExceeded for a larger body)."""
    if body is None:
        raise InvalidMessage("body must be a data section holding UTF-8 JSON")
    if len(body) > MAX_BODY_BYTES:
        raise LimitExceeded(f"body is {len(body)} bytes; at most {MAX_BODY_BYTES} are allowed", limit=BODY_LIMIT)
    try:
        return msgspec.json.decode(body, type=model)
    except msgspec.ValidationError as exc:
        raise InvalidMessage(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise InvalidMessage(f"body is not UTF-8 JSON: {exc}") from None
    except RecursionError:
        raise InvalidMessage("body is nested too deeply to parse") from None


def timestamp(value: str, path: str) -> datetime:
    """Parse an ISO 8601 timestamp that carries a time-zone offset; ValueError names the rule and path."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"Expected an ISO 8601 timestamp - at `{path}`") from None
    if moment.tzinfo is None:
        raise ValueError(f"Expected a time-zone offset, such as Z - at `{path}`")
    return moment


def schema(model: type[Any]) -> dict[str, Any]:
    """The model's JSON Schema (2020-12), for producers to validate against before they send."""
    return msgspec.json.schema(model)
