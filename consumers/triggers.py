"""The app's five functions: the library's ``Consumer`` blueprint, on the app's settings, names and runtime.

- ``process_order``: OrderPlaced messages into Cosmos DB, effectively once (the app's own handler,
  ``App.handle_order``: a plan cannot state its pending-order adoption and its status guards).
- ``process_order_event``: order lifecycle events, applied exactly once and in order by the library's ordered
  mode with the order's machine (a session per order, or a plain queue with ORDER_EVENTS_SESSIONS false).
- ``publish_outbox``: the orders container's change feed; sends each pending OrderAccepted.
- ``sweep_outbox``: a timer; publishes outbox entries the change feed missed.
- ``report_stuck``: a timer; reports events parked too long and side effects stuck in progress.

The library owns the triggers (PeekLock, ``auto_complete_messages=False``, the SDK-type binding), the delivery
policy and the settlement. ``make_blueprint`` runs when the host indexes the functions: it reads the binding names
(queues, containers, schedules) from the settings it is given, and checks the retention rule for each queue,
which refuses to start when markers would expire too early. The functions reach the app through ``root``, called
on each invocation: production's builds it once, on the first; a test hands in its own. The companions keep the
names they were deployed under, and the publisher its leases (no prefix), so that the change feed resumes where
it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from idempotent_consumer.functions.consumer import Companions, Consumer
from shared.domain.aggregate import ORDERS
from shared.settings import Settings

if TYPE_CHECKING:
    from idempotent_consumer.messages import InboundMessage
    from idempotent_consumer.outcomes import Result
    from shared.bootstrap import App

NAMES = Companions(publish_outbox="publish_outbox", sweep_outbox="sweep_outbox", report_stuck="report_stuck",
                   lease_prefix="")


def make_blueprint(settings: Settings, root: Callable[[], App]) -> Consumer:
    """The five functions, bound as ``settings`` names them, each running on the app ``root()`` returns.

    Raises (failing the functions' indexing, with the computation in the error) when the retention
    rule does not hold for either queue.
    """
    orders = Consumer(settings.consumer_name, container=settings.cosmos_container, partition_key="/orderId",
                      settings=settings, root=root, companions=NAMES)
    orders.handler(settings.orders_queue, handle_order, check=check_order, function_name="process_order")
    orders.ordered(settings.order_events_queue, ORDERS, sessions=settings.order_events_sessions,
                   function_name="process_order_event")
    return orders


# The handlers' modules load on the first invocation (with the app, ``root()``), not while the host indexes.
def from_environment() -> App:
    """The app, built from the environment (``shared.bootstrap.from_environment``)."""
    from shared import bootstrap  # noqa: PLC0415

    return bootstrap.from_environment()


async def handle_order(app: App, message: InboundMessage) -> Result:
    """One OrderPlaced delivery, decided by the app."""
    return await app.handle_order(message)


def check_order(message: InboundMessage) -> Result | None:
    """What needs no dependency to decide of an OrderPlaced delivery (``shared.handlers.place_order.check_order``)."""
    from shared.handlers.place_order import check_order as check  # noqa: PLC0415

    return check(message)
