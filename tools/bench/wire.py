"""Requests counted on the wire: an azure-core async transport that counts what the Cosmos SDK sends, and what a
proxy reads of a request's body.

The transport sits below the SDK's retry policy, so a retried request counts each time it is sent, and it adds
up the request charge (``x-ms-request-charge``) where the server reports one (Azure does; the local
server does not).
"""

from __future__ import annotations

import re
import threading
from typing import Any

from azure.core.pipeline.transport import AioHttpTransport

# The outbox publisher's finish of a sent entry, in a transactional batch's body: its delete (an operation with no body
# whose id is an outbox entry's), or, where sent entries are kept, its mark (status set to dispatched, by a patch or a
# whole document).
_OUTBOX_FINISH = re.compile(rb'"/?status"[^}]*?"dispatched"|\{[^{}]*"Delete"[^{}]*"outbox\.[^{}]*\}')


def finishes_sent_outbox(body: bytes) -> bool:
    """Whether a batch request's body is (or holds) the outbox publisher's delete or mark of an entry it sent."""
    return _OUTBOX_FINISH.search(body) is not None


class CountingTransport(AioHttpTransport):  # type: ignore[misc]  # azure-core is untyped here
    """AioHttpTransport that counts requests and request units (the product's transport, counted)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._counting = threading.Lock()
        self.requests = 0
        self.request_units = 0.0
        self.charged = False  # whether any answer carried a request charge

    async def send(self, request: Any, **kwargs: Any) -> Any:
        with self._counting:
            self.requests += 1  # before the send: one that fails in transit was still sent
        response = await super().send(request, **kwargs)
        charge = response.headers.get("x-ms-request-charge")
        with self._counting:
            if charge is not None:
                self.charged = True
                self.request_units += float(charge)
        return response

    def snapshot(self) -> tuple[int, float]:
        """(requests, request units) so far."""
        with self._counting:
            return self.requests, self.request_units
