"""The lifecycle-event handler: the library's ordered mode (``idempotent_consumer.ordered``) run by the order's
state machine (``aggregate.ORDERS``), with this consumer's settings."""

from __future__ import annotations

import time
from collections.abc import Callable

from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ordered import Ordered
from idempotent_consumer.ordered.apply import check
from idempotent_consumer.ordered.writes import Releases
from idempotent_consumer.outcomes import Result
from idempotent_consumer.ports.store import DocumentStore
from shared.domain.aggregate import ORDERS
from shared.settings import Settings


def ordered(settings: Settings, clock: Callable[[], float] = time.time,
            releases: type[Releases] = Releases) -> Ordered:
    """The ordered mode as ``settings`` configure it."""
    return Ordered(ORDERS, settings.consumer_name, settings.dedup_ttl_seconds,
                   settings.retention.identity_ttl_seconds, settings.parked_set_aside_ttl_seconds, releases, clock)


async def apply_order_event(message: InboundMessage, store: DocumentStore, settings: Settings,
                            clock: Callable[[], float] = time.time, releases: type[Releases] = Releases) -> Result:
    """Apply one lifecycle event exactly once for this consumer, in order, or park it until it can be."""
    return await ordered(settings, clock, releases).apply(message, store)


def check_event(message: InboundMessage) -> Result | None:
    """What needs no dependency to decide: the final result of a delivery that is no valid event, else None."""
    return check(ORDERS, message)
