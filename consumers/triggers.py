"""The app's five functions, as one blueprint. Each translates, hands the delivery to the app the
composition root built, and (for Service Bus) settles through the binding; nothing else happens here.

- ``process_order``: OrderPlaced messages into Cosmos DB, effectively once.
- ``process_order_event``: order lifecycle events, applied exactly once and in order (a session per order,
  or a plain queue with ORDER_EVENTS_SESSIONS false).
- ``publish_outbox``: the orders container's change feed; sends each pending OrderAccepted.
- ``sweep_outbox``: a timer; publishes outbox entries the change feed missed.
- ``report_stuck``: a timer; reports events parked too long and side effects stuck in progress.

``make_blueprint`` runs when the host indexes the functions: it reads the binding names (queues,
containers, schedules) from the settings it is given, and checks the retention rule, which refuses to
start when markers would expire too early. The function bodies reach the app through ``root``, called
on each invocation: production's builds it once, on the first; a test hands in its own.

Every function is ``async def``: the worker runs them all on its one event loop, where the async
clients live (measured: README "Performance", async against sync).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import azure.functions as func
from azurefunctions.extensions.bindings import servicebus

from idempotent_consumer.functions import lock_renewal
from idempotent_consumer.functions.binding import to_inbound
from idempotent_consumer.functions.settlement import ActionsSettlement
from idempotent_consumer.outbox import PublishReport
from shared.bootstrap import App
from shared.settings import Settings

logger = logging.getLogger("idempotent_consumer.functions")


def _log(function: str, report: PublishReport) -> None:
    logger.info(
        "%s dispatched=%d failed=%d skipped=%d", function, len(report.dispatched), len(report.failed), report.skipped,
        extra={"function": function, "dispatched": len(report.dispatched), "failed": len(report.failed)},
    )


def make_blueprint(settings: Settings, root: Callable[[], App]) -> func.Blueprint:
    """The five functions, bound as ``settings`` names them, each running on the app ``root()`` returns.

    Raises (failing the functions' indexing, with the computation in the error) when the retention
    rule does not hold for either queue.
    """
    for queue in (settings.orders_queue, settings.order_events_queue):
        settings.retention.check(queue)
    renewal = lock_renewal.renewal_seconds()  # the host renews a message's lock this long; a session's, from its accept
    blueprint = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions 1.x is untyped here

    @blueprint.function_name("process_order")
    @blueprint.service_bus_queue_trigger(
        arg_name="msg", queue_name=settings.orders_queue, connection="ServiceBusConnection",
        auto_complete_messages=False,
    )
    async def process_order(
        msg: servicebus.ServiceBusReceivedMessage, message_actions: servicebus.ServiceBusMessageActions
    ) -> None:
        """Service Bus trigger (PeekLock): settle every delivery explicitly, exactly once."""
        app = root()
        await app.deliver("process_order", functools.partial(to_inbound, msg, renewal=renewal), app.handle_order,
                          ActionsSettlement(msg, message_actions), queue=settings.orders_queue)

    @blueprint.function_name("process_order_event")
    @blueprint.service_bus_queue_trigger(
        arg_name="msg", queue_name=settings.order_events_queue, connection="ServiceBusConnection",
        is_sessions_enabled=settings.order_events_sessions, auto_complete_messages=False,
    )
    async def process_order_event(
        msg: servicebus.ServiceBusReceivedMessage, message_actions: servicebus.ServiceBusMessageActions
    ) -> None:
        """Service Bus trigger (PeekLock), a session per order unless ORDER_EVENTS_SESSIONS is false: settle
        every delivery explicitly, exactly once."""
        app = root()
        read = functools.partial(to_inbound, msg, renewal=0.0 if settings.order_events_sessions else renewal)
        await app.deliver("process_order_event", read, app.handle_event,
                          ActionsSettlement(msg, message_actions, sessions=settings.order_events_sessions),
                          queue=settings.order_events_queue)

    @blueprint.function_name("publish_outbox")
    @blueprint.cosmos_db_trigger(
        arg_name="documents", connection="CosmosDBConnection", database_name=settings.cosmos_database,
        container_name=settings.cosmos_container, lease_container_name=settings.cosmos_leases_container,
        create_lease_container_if_not_exists=False,
    )
    async def publish_outbox(documents: func.DocumentList) -> None:
        """Change feed of the orders container: send each pending outbox entry, then mark it dispatched.

        An entry that cannot be sent stays pending for sweep_outbox; the change feed does not retry.
        """
        _log("publish_outbox", await root().publisher().publish(doc.to_dict() for doc in documents))

    @blueprint.function_name("sweep_outbox")
    @blueprint.timer_trigger(arg_name="timer", schedule=settings.outbox_sweep_schedule, run_on_startup=False)
    async def sweep_outbox(timer: func.TimerRequest) -> None:
        """Publish outbox entries still pending after OUTBOX_STUCK_AFTER_SECONDS: a missed feed batch is not lost."""
        app = root()
        _log("sweep_outbox", await app.publisher().sweep(stuck_after_seconds=app.settings.outbox_stuck_after_seconds))

    @blueprint.function_name("report_stuck")
    @blueprint.timer_trigger(arg_name="timer", schedule=settings.stuck_report_schedule, run_on_startup=False)
    async def report_stuck(timer: func.TimerRequest) -> None:
        """Log and count events parked past PARKED_ALERT_AFTER_SECONDS and side effects stuck in progress."""
        app = root()
        found = await app.report_stuck(app.clock())
        logger.info("report_stuck parked=%d sideEffects=%d", len(found.parked), len(found.side_effects),
                    extra={"function": "report_stuck", "parked": len(found.parked), "stuck": len(found.side_effects)})

    return blueprint
