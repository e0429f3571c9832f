"""Small shared checks for message bodies; each failure raises InvalidMessage naming the rule."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from shared.errors import InvalidMessage

MAX_BODY_BYTES = 256 * 1024
MAX_ID_LENGTH = 255
FORBIDDEN_ID_CHARACTERS = frozenset("/\\?#")
# Cosmos DB stores numbers as IEEE 754 doubles: larger integers would not round-trip exactly.
MAX_EXACT_INTEGER = 2**53 - 1
_DECIMAL = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
MAX_INTEGER_DIGITS = 18
MAX_FRACTION_DIGITS = 10


def parse_json_object(body: bytes | None) -> dict[str, Any]:
    """Decode a UTF-8 JSON object body of at most 256 KB."""
    if body is None:
        raise InvalidMessage("body must be a data section holding UTF-8 JSON")
    if len(body) > MAX_BODY_BYTES:
        raise InvalidMessage(f"body is {len(body)} bytes; at most {MAX_BODY_BYTES} are allowed")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidMessage("body is not valid UTF-8") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise InvalidMessage("body is nested too deeply to parse") from None
    except ValueError:
        # json.JSONDecodeError, and int() refusing numbers of more than 4300 digits.
        raise InvalidMessage("body is not valid JSON") from None
    if not isinstance(value, dict):
        raise InvalidMessage("body must be a JSON object")
    return value


def require_object(container: Mapping[str, Any], key: str, where: str = "") -> Mapping[str, Any]:
    """Return a nested JSON object field."""
    value = container.get(key)
    if not isinstance(value, dict):
        raise InvalidMessage(f"{where}{key} must be a JSON object")
    return value


def require_string(container: Mapping[str, Any], key: str, where: str = "", max_length: int = 1024) -> str:
    """Return a non-empty string field of bounded length."""
    value = container.get(key)
    if not isinstance(value, str) or not value.strip():
        raise InvalidMessage(f"{where}{key} must be a non-empty string")
    if len(value) > max_length:
        raise InvalidMessage(f"{where}{key} is longer than {max_length} characters")
    return value


def require_cosmos_id(container: Mapping[str, Any], key: str, where: str = "") -> str:
    """Return a string usable as a Cosmos DB id: at most 255 characters, none of / \\ ? #."""
    value = require_string(container, key, where, max_length=MAX_ID_LENGTH)
    if any(ch in FORBIDDEN_ID_CHARACTERS for ch in value):
        raise InvalidMessage(f"{where}{key} must not contain any of / \\ ? #")
    return value


def require_positive_int(container: Mapping[str, Any], key: str, where: str = "") -> int:
    """Return a JSON integer (not a float, not a boolean) between 1 and 2^53 - 1."""
    value = container.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidMessage(f"{where}{key} must be an integer")
    if value < 1:
        raise InvalidMessage(f"{where}{key} must be a positive integer")
    if value > MAX_EXACT_INTEGER:
        raise InvalidMessage(f"{where}{key} must be at most {MAX_EXACT_INTEGER}")
    return value


def require_amount(container: Mapping[str, Any], key: str, where: str = "") -> Decimal:
    """Return a money amount given as a decimal string, at least zero, of bounded precision."""
    value = container.get(key)
    if not isinstance(value, str):
        raise InvalidMessage(f"{where}{key} must be a decimal string such as \"19.99\"")
    if not _DECIMAL.fullmatch(value):
        raise InvalidMessage(f"{where}{key} is not a decimal number")
    integer, _, fraction = value.lstrip("-").partition(".")
    if len(integer) > MAX_INTEGER_DIGITS or len(fraction) > MAX_FRACTION_DIGITS:
        raise InvalidMessage(
            f"{where}{key} has more than {MAX_INTEGER_DIGITS} integer or {MAX_FRACTION_DIGITS} fraction digits"
        )
    try:
        amount = Decimal(value)
    except InvalidOperation:  # pragma: no cover - the pattern above admits only valid decimals
        raise InvalidMessage(f"{where}{key} is not a decimal number") from None
    if amount < 0:
        raise InvalidMessage(f"{where}{key} must be at least 0")
    return amount


def require_currency(container: Mapping[str, Any], key: str, where: str = "") -> str:
    """Return a three-letter currency code, upper-cased."""
    value = container.get(key)
    if not isinstance(value, str) or len(value) != 3 or not (value.isascii() and value.isalpha()):
        raise InvalidMessage(f"{where}{key} must be 3 letters, such as EUR")
    return value.upper()


def require_timestamp(container: Mapping[str, Any], key: str, where: str = "") -> datetime:
    """Return an ISO 8601 timestamp that carries a time-zone offset."""
    value = require_string(container, key, where, max_length=64)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidMessage(f"{where}{key} must be an ISO 8601 timestamp") from None
    if moment.tzinfo is None:
        raise InvalidMessage(f"{where}{key} must carry a time-zone offset, such as Z")
    return moment
