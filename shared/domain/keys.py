"""Derived keys and request hashes: deterministic, collision-free ids, and fingerprints of content.

Used for inbox-marker ids (consumer + dedup key) and, downstream, idempotency keys and outgoing
MessageIds (consumer + dedup key + effect name). Each part is length-prefixed before hashing, so
("ab", "c") and ("a", "bc") never derive the same key, whatever characters the parts contain.

A request hash is the sha256 of a message's canonical form, so equal content hashes equally however
it was formatted.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
MAX_LABEL_CHARS = 48


def digest(*parts: str) -> str:
    """The hex sha256 of the length-prefixed UTF-8 parts."""
    hasher = hashlib.sha256()
    for part in parts:
        encoded = part.encode("utf-8")
        hasher.update(len(encoded).to_bytes(8, "big"))
        hasher.update(encoded)
    return hasher.hexdigest()


def derive_id(kind: str, *parts: str, label: str = "") -> str:
    """A legal Cosmos DB id (and Service Bus MessageId): ``kind.label.digest``.

    The label is a readable, sanitised prefix for operators; uniqueness comes from the digest of
    (kind, *parts) alone. Result: at most 128 characters of [A-Za-z0-9_.-].
    """
    readable = _UNSAFE.sub("_", label)[:MAX_LABEL_CHARS]
    prefix = f"{_UNSAFE.sub('_', kind)[:16]}.{readable}." if readable else f"{_UNSAFE.sub('_', kind)[:16]}."
    return prefix + digest(kind, *parts)


def idempotency_key(consumer: str, effect: str, *dedup_key: str) -> str:
    """The key an effect of one incoming message carries downstream (HTTP header, outgoing MessageId).

    Deterministic, so a redelivery sends the same key and the next layer can drop the repeat; distinct
    across consumers and effect names, so two effects of one message never share a key.
    """
    return derive_id("effect", consumer, effect, *dedup_key, label=effect)


def canonical_decimal(value: Decimal) -> str:
    """Spell a decimal one way only: no exponent, no trailing fractional zeros ("39.980" -> "39.98")."""
    text = format(value, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def request_hash(canonical: Mapping[str, Any]) -> str:
    """The hex sha256 of a canonical mapping: sorted keys, no whitespace, UTF-8."""
    encoded = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()
