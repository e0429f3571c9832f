"""Competing consumers: 16 copies of one message delivered at the same moment, against real Cosmos.

The worker awaits concurrent invocations of an async function as tasks on its one loop; so do these
tests: 16 tasks released together by a barrier, their Cosmos and fulfilment requests in flight at once.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

from devservers.fulfilment import FulfilmentServer
from tests.functions.conftest import Deliverer, Harness
from tests.support.orders import encode, order_body

COPIES = 16


def deliver_all_at_once(deliver: Deliverer, bodies: list[bytes], message_id: str) -> list[tuple[str, str | None]]:
    messages = [deliver.message(body, message_id=message_id) for body in bodies]
    actions = deliver.host.message_actions()

    async def all_at_once() -> None:
        start = asyncio.Barrier(len(messages))

        async def run(msg: object) -> None:
            await start.wait()
            await deliver.function(msg, actions)

        await asyncio.gather(*(run(m) for m in messages))

    deliver.loop.run(all_at_once())
    settled = [deliver.settlements(m) for m in messages]
    assert all(len(s) == 1 for s in settled), "every delivery must end in exactly one settlement"
    return [(s[0].action, s[0].reason) for s in settled]


def documents(target: Harness, order_id: str, doc_type: str = "order") -> list[dict]:
    docs = target.container.query_items("SELECT * FROM c", partition_key=order_id)
    return [d for d in docs if d.get("type") == doc_type]


def test_sixteen_copies_of_one_message_give_one_document_and_one_reservation(
    app_on_cosmos: Harness, deliver_order: Deliverer, fulfilment: FulfilmentServer
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    body = encode(order_body(order_id))
    outcomes = deliver_all_at_once(deliver_order, [body] * COPIES, order_id)
    # One copy creates the order and reserves. The others find the order's id taken with the same
    # requestHash: a duplicate once the reservation is finished, or, while it is in flight, in_progress
    # (its claim is another message's, whose own redeliveries finish it). Both complete: none waits.
    assert outcomes == [("complete", None)] * COPIES
    assert len(documents(app_on_cosmos, order_id)) == 1
    assert len(documents(app_on_cosmos, order_id, "outbox")) == 1
    [record] = documents(app_on_cosmos, order_id, "side-effect")
    assert record["status"] == "completed"
    assert fulfilment.keys().count(record["idempotencyKey"]) == 1
    assert [r["key"] for r in fulfilment.reservations()].count(record["idempotencyKey"]) == 1


def test_sixteen_payloads_under_one_id_give_one_winner_and_fifteen_payload_mismatches(
    app_on_cosmos: Harness, deliver_order: Deliverer
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    bodies = [
        encode(order_body(order_id, items=[{"sku": f"SKU-{n}", "quantity": 1, "unitPrice": "1.00"}], total="1.00"))
        for n in range(COPIES)
    ]
    outcomes = deliver_all_at_once(deliver_order, bodies, order_id)
    assert Counter(outcomes) == {("complete", None): 1, ("deadletter", "PayloadMismatch"): COPIES - 1}
    [doc] = documents(app_on_cosmos, order_id)
    winner = outcomes.index(("complete", None))
    assert doc["items"][0]["sku"] == f"SKU-{winner}"
