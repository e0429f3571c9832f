"""The fulfilment service watched for the breaker: what one delivery attempt reached of it, noted in the
attempt's ``Reach`` (``idempotent_consumer.ports.watched``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from idempotent_consumer.errors import DownstreamUnavailable
from idempotent_consumer.outcomes import is_unavailable
from idempotent_consumer.ports.watched import note
from shared.ports.fulfilment import FulfilmentService, Reply

FULFILMENT = "fulfilment"


class _WatchedFulfilment:
    """A fulfilment service that notes, in the current attempt's ``Reach``, whether it answered or was down. A
    read timeout is an answer of a kind: the service took the request (``DownstreamUnavailable.slow``)."""

    def __init__(self, fulfilment: FulfilmentService) -> None:
        self._fulfilment = fulfilment

    async def reserve(self, idempotency_key: str, request: Mapping[str, Any]) -> Reply:
        try:
            reply = await self._fulfilment.reserve(idempotency_key, request)
        except DownstreamUnavailable as exc:
            note(FULFILMENT, up=exc.slow)
            raise
        note(FULFILMENT, up=not is_unavailable(reply.status))
        return reply


def watched_fulfilment(fulfilment: FulfilmentService) -> FulfilmentService:
    """``fulfilment``, noting what it answered in the current attempt's ``Reach``."""
    return _WatchedFulfilment(fulfilment)
