"""Payload fingerprints: sha256 over a canonical JSON form, so equal content hashes equally."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any


def canonical_decimal(value: Decimal) -> str:
    """Spell a decimal one way only: no exponent, no trailing fractional zeros ("39.980" -> "39.98")."""
    text = format(value, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def request_hash(canonical: Mapping[str, Any]) -> str:
    """Return the hex sha256 of a canonical mapping: sorted keys, no whitespace, UTF-8."""
    encoded = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()
