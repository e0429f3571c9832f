"""Bugs the chaos suite must find, planted in a generated copy of the app's entry point, never in the product.

``python -m chaos --plant NAME`` runs every host on a generated app folder (``chaos.versions``) whose
``function_app.py`` plants the bug and then loads the real ``function_app.py``; the rest of the run is
unchanged. The suite's own tests run it and expect a failing run that names the broken invariant.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Mapping
from typing import Any


def _fresh_reservation_key() -> None:
    from shared.adapters.http import HttpFulfilment  # noqa: PLC0415 - patched only when planted

    original = HttpFulfilment.reserve

    async def reserve(self: HttpFulfilment, idempotency_key: str, request: Mapping[str, Any]) -> Any:
        return await original(self, f"{idempotency_key}-{uuid.uuid4().hex[:8]}", request)

    HttpFulfilment.reserve = reserve  # type: ignore[method-assign]


def _typed_order_replace() -> None:
    from idempotent_consumer.errors import StoreError  # noqa: PLC0415
    from idempotent_consumer.ordered import writes  # noqa: PLC0415
    from idempotent_consumer.ports.store import Replace  # noqa: PLC0415
    from shared.domain.documents import OrderDocument  # noqa: PLC0415 - patched only when planted

    applied = writes.EventWrites.apply

    async def apply(self: writes.EventWrites) -> None:
        await applied(self)
        # ...then the order saved back from its typed model, as code that "normalises" it would: every
        # field this version does not model is dropped.
        stored = await self.store.read(self.event.subject, self.event.subject)
        typed = OrderDocument.from_document(stored).to_document()
        with contextlib.suppress(StoreError):  # changed meanwhile: this time nothing was dropped
            await self.store.execute_batch(self.event.subject, [Replace(typed, stored["_etag"])])

    writes.EventWrites.apply = apply  # type: ignore[method-assign]


PLANTS: dict[str, tuple[str, Callable[[], None]]] = {
    "fresh-reservation-key": ("every fulfilment call sends a new idempotency key, so a retry after a lost"
                              " or late answer reserves stock twice", _fresh_reservation_key),
    "typed-order-replace": ("after an event in order, the order is saved back whole from its typed document,"
                            " which drops the fields this version does not model (the next version's, in a"
                            " rolling upgrade)",
                            _typed_order_replace),
}

def plant(name: str) -> None:
    """Apply the planted bug ``name`` in this process (the worker's, from the generated entry point)."""
    PLANTS[name][1]()
