"""Identity as a contract: every derived id and key, one function each, and the request hash.

Once a document or a downstream call carries one of these, its formula can never change without a
migration: an in-flight order would get a new reservation key and reserve its stock a second time,
or a redelivered event a new marker id and apply twice. ``tests/unit/test_identity.py`` pins each
function to known values, as ``test_known_hashes.py`` pins the request hashes.

Each id of something a consumer does for a key is labelled by (consumer, name, key): the name of the effect or
the outgoing message, and the key it is done for, so that any consumer derives its own with the same functions
(the order app's, in ``shared.domain.identity``, are these with its names).

A derived id is ``kind.label.digest``: the label is a readable, sanitised prefix for operators; the
digest of (kind, *parts) alone makes it unique. Each part is length-prefixed before hashing, so
("ab", "c") and ("a", "bc") never derive the same id, whatever characters the parts contain. The
result is a legal Cosmos DB id and Service Bus MessageId: at most 128 characters of [A-Za-z0-9_.-].

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
    """``kind.label.digest``: the rule every id below follows (and a second consumer's own ids may)."""
    readable = _UNSAFE.sub("_", label)[:MAX_LABEL_CHARS]
    prefix = f"{_UNSAFE.sub('_', kind)[:16]}.{readable}." if readable else f"{_UNSAFE.sub('_', kind)[:16]}."
    return prefix + digest(kind, *parts)


def effect_key(consumer: str, effect: str, key: str) -> str:
    """The Idempotency-Key one consumer's named effect of one key (here an order's id) carries downstream.

    Deterministic, so a redelivery sends the same key and the service drops the repeat; distinct across
    consumers and effects, so two effects of one key never share a key.
    """
    return derive_id("effect", consumer, effect, key, label=effect)


def side_effect_id(consumer: str, effect: str, key: str) -> str:
    """The id of the two-phase record of one consumer's named effect of one key."""
    return derive_id("side-effect", consumer, effect, key, label=effect)


def outgoing_entry_id(consumer: str, name: str, key: str) -> str:
    """The id of the outbox entry of one consumer's named outgoing message of one key."""
    return derive_id("outbox", consumer, name, key, label=name)


def outgoing_message_id(consumer: str, name: str, key: str) -> str:
    """The MessageId one consumer's named outgoing message of one key is sent with, so that every resend is a
    duplicate downstream. Effects and outgoing messages share the names of one consumer: one name, one id."""
    return effect_key(consumer, name, key)


def retry_message_id(original_message_id: str, chain: str, attempt: int) -> str:
    """The MessageId of copy ``attempt`` of a message handed on for a delayed retry (``idempotent_consumer.retries``):
    a copy sent again after a crash is a duplicate the queue drops; each attempt and each chain is new."""
    return derive_id("retry", original_message_id, chain, str(attempt), label=f"{attempt}_{original_message_id}")


def inbox_marker_id(consumer: str, source: str, event_id: str) -> str:
    """The id of the marker that says one consumer has applied (or parked) one event."""
    return derive_id("inbox", consumer, source, event_id, label=consumer)


def event_identity_id(consumer: str, source: str, event_id: str) -> str:
    """The id of one consumer's record of an event's identity (``source`` + ``id``, as CloudEvents defines it),
    kept in a partition of its own (its id is its partition key), so that the identity holds across orders:
    the same key under another subject is the same event with other content, never a new one."""
    return derive_id("event", consumer, source, event_id, label=consumer)


def key_marker_id(consumer: str, key: str) -> str:
    """The id of the marker that says one consumer has taken one message key (``idempotent_consumer.plan``), in the
    key's partition: created in the batch of the key's writes, it is their duplicate check."""
    return derive_id("key", consumer, key, label=consumer)


def key_identity_id(consumer: str, key: str) -> str:
    """The id of one consumer's record of a key across partitions (a plan's ``global`` scope), in a partition of
    its own (its id is its partition key): the same key with another partition is the same message with other
    content, never a new one."""
    return derive_id("key-identity", consumer, key, label=consumer)


def parked_event_id(consumer: str, source: str, event_id: str, sequence: int) -> str:
    """The id of a parked event; the label shows the version it waits to become."""
    return derive_id("parked", consumer, source, event_id, label=f"v{sequence}")


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
