"""Competing consumers: 16 threads deliver copies of one message at the same moment, against real Cosmos."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from tests.functions.conftest import CosmosTarget, Deliverer
from tests.support.orders import encode, order_body

COPIES = 16


def deliver_all_at_once(deliver: Deliverer, bodies: list[bytes], message_id: str) -> list[tuple[str, str | None]]:
    messages = [deliver.message(body, message_id=message_id) for body in bodies]
    actions = deliver.host.message_actions()
    start = threading.Barrier(len(messages))

    def run(msg: object) -> None:
        start.wait()
        deliver.function(msg, actions)

    with ThreadPoolExecutor(max_workers=len(messages)) as pool:
        for future in [pool.submit(run, m) for m in messages]:
            future.result()
    settled = [deliver.host.recorder.settlements_for(m.lock_token) for m in messages]
    assert all(len(s) == 1 for s in settled), "every delivery must end in exactly one settlement"
    return [(s[0].action, s[0].reason) for s in settled]


def documents(target: CosmosTarget, order_id: str) -> list[dict]:
    return list(target.container.query_items("SELECT * FROM c", partition_key=order_id))


def test_sixteen_copies_of_one_message_give_one_document_and_sixteen_completes(
    app_on_cosmos: CosmosTarget, deliver_order: Deliverer
) -> None:
    order_id = f"ord-{uuid.uuid4()}"
    body = encode(order_body(order_id))
    outcomes = deliver_all_at_once(deliver_order, [body] * COPIES, order_id)
    assert Counter(outcomes) == {("complete", None): COPIES}
    assert len(documents(app_on_cosmos, order_id)) == 1


def test_sixteen_payloads_under_one_id_give_one_winner_and_fifteen_payload_mismatches(
    app_on_cosmos: CosmosTarget, deliver_order: Deliverer
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
