"""Derived keys are deterministic, legal ids, and never collide across parts, consumers or kinds."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from shared.domain.keys import derive_id, digest, idempotency_key

LEGAL_ID = re.compile(r"[A-Za-z0-9_.-]{1,255}")


def test_same_parts_derive_the_same_id() -> None:
    assert derive_id("inbox", "billing", "/src", "e-1") == derive_id("inbox", "billing", "/src", "e-1")


def test_part_boundaries_matter() -> None:
    assert digest("ab", "c") != digest("a", "bc")
    assert digest("a/b") != digest("a", "b")


def test_consumers_and_kinds_derive_different_ids() -> None:
    ids = {
        derive_id("inbox", "billing", "/src", "e-1"),
        derive_id("inbox", "shipping", "/src", "e-1"),
        derive_id("outbox", "billing", "/src", "e-1"),
        derive_id("inbox", "billing", "/src", "e-2"),
    }
    assert len(ids) == 4


def test_label_does_not_decide_identity() -> None:
    assert derive_id("inbox", "x", label="a").rsplit(".", 1)[1] == derive_id("inbox", "x", label="b").rsplit(".", 1)[1]


@given(parts=st.lists(st.text(), min_size=1, max_size=4), label=st.text())
def test_any_parts_derive_a_legal_cosmos_id(parts: list[str], label: str) -> None:
    assert LEGAL_ID.fullmatch(derive_id("inbox", *parts, label=label))


@given(a=st.lists(st.text(max_size=5), min_size=1, max_size=3), b=st.lists(st.text(max_size=5), min_size=1, max_size=3))
def test_different_parts_never_share_a_digest(a: list[str], b: list[str]) -> None:
    if a != b:
        assert digest(*a) != digest(*b)


def test_idempotency_keys_are_deterministic_and_distinct_across_consumers_and_effects() -> None:
    assert idempotency_key("intake", "reserve-stock", "ord-1") == idempotency_key("intake", "reserve-stock", "ord-1")
    keys = {
        idempotency_key(consumer, effect, order)
        for consumer in ("intake", "billing")
        for effect in ("reserve-stock", "OrderAccepted")
        for order in ("ord-1", "ord-2")
    }
    assert len(keys) == 8
    assert all(LEGAL_ID.fullmatch(k) and len(k) <= 128 for k in keys)
