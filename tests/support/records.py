"""The applied events' records and the reservation claims in a set of documents, wherever they stand; and the
fixture that runs a test with the claims in either form."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest

from idempotent_consumer.errors import NotFound
from idempotent_consumer.ports.store import Create, Delete, DocumentStore, Replace
from idempotent_consumer.side_effects import SideEffect, stored_claims
from shared.domain.documents import event_records
from shared.handlers import place_order
from shared.handlers.place_order import RESERVATION_CLAIM
from shared.settings import Settings

EVENT_KINDS = ("payment", "shipment", "cancellation")


def recorded(documents: Iterable[Mapping[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The records of the applied events of ``kind`` (``payment``, ``shipment``, ``cancellation``): each order's
    sub-object of that name where it carries an event's identity, and any record document of that type (which a
    release before the sub-object held the identity wrote)."""
    return [dict(record) for found, record in event_records(documents) if found == kind]


def claims(documents: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The reservation claims among ``documents``, in either form (a document of its own, or kept in its order under
    ``reservationClaim``), each as a document of its own reads."""
    return [dict(claim) for claim in stored_claims(documents, RESERVATION_CLAIM)]


@pytest.fixture(params=["claim of its own", "claim in the order"])
def claim_form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test that uses it runs twice: with the order app writing a new order's reservation claim as a document
    of its own (RESERVATION_CLAIM_IN_ORDER false, the default) and inside the order (true)."""
    if request.param == "claim in the order":
        made = place_order.reservation

        def in_the_order(store: DocumentStore, settings: Settings,
                         clock: Callable[[], float] = time.time) -> SideEffect:
            return dataclasses.replace(made(store, settings, clock), write_within=True)

        monkeypatch.setattr(place_order, "reservation", in_the_order)
    return str(request.param)


def of_kind(documents: Iterable[Mapping[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The documents of ``kind`` (their ``type``); for ``side-effect``, the claims in either form (``claims``)."""
    return claims(documents) if kind == "side-effect" else [dict(d) for d in documents if d.get("type") == kind]


async def replaced(store: DocumentStore, document: Mapping[str, Any]) -> dict[str, Any]:
    """Write ``document`` whole where it stands, as another writer would: a claim kept in its order (as ``claims``
    reads it: it carries ``rev``) into its order, its ``rev`` raised as every writer of such a claim must; any other
    document in its own place. What was written, as ``claims`` reads a claim."""
    if document.get("type") == "side-effect" and "rev" in document:
        order = await store.read(document["orderId"], document["orderId"])
        kept = {k: v for k, v in document.items() if k not in ("id", "type", "orderId", "_etag")}
        kept["rev"] = int(order[RESERVATION_CLAIM]["rev"]) + 1
        order = {k: v for k, v in order.items() if not k.startswith("_")}
        if "due" in kept:  # the order's own, where a claim kept in it is due
            order["due"] = kept.pop("due")
        [written] = await store.execute_batch(document["orderId"], [Replace({**order, RESERVATION_CLAIM: kept})])
        [claim] = claims([written])
        return claim
    [written] = await store.execute_batch(document["orderId"], [Replace(dict(document))])
    return written


async def removed(store: DocumentStore, claim: Mapping[str, Any]) -> None:
    """Remove a claim (as ``claims`` reads it) by hand, as an operator would: from its order, or its own document."""
    if "rev" in claim:
        order = await store.read(claim["orderId"], claim["orderId"])
        kept = {k: v for k, v in order.items() if k != RESERVATION_CLAIM and not k.startswith("_")}
        await store.execute_batch(claim["orderId"], [Replace(kept)])
    else:
        await store.execute_batch(claim["orderId"], [Delete(claim["id"])])


async def as_own_document(store: DocumentStore, claim: Mapping[str, Any]) -> None:
    """Write a claim (as ``claims`` reads it) as a document of its own, as the releases before the claim in the order
    wrote every claim: taken out of its order if it was kept there."""
    if "rev" in claim:
        await removed(store, claim)
    own = {k: v for k, v in claim.items() if k not in ("rev", "_etag")}
    try:
        await store.read(own["id"], own["orderId"])
    except NotFound:
        await store.execute_batch(own["orderId"], [Create(own)])
    else:
        await store.execute_batch(own["orderId"], [Replace(own)])
