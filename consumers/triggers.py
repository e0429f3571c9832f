"""The app's five functions, as one blueprint. Each translates, calls a handler through the
composition root, and (for Service Bus) settles; nothing else happens here.

- ``process_order``: OrderPlaced messages into Cosmos DB, effectively once.
- ``process_order_event``: order lifecycle events, per session, applied exactly once and in order.
- ``publish_outbox``: the orders container's change feed; sends each pending OrderAccepted.
- ``sweep_outbox``: a timer; publishes outbox entries the change feed missed.
- ``report_stuck``: a timer; reports events parked too long and side effects stuck in progress.

Binding names (queues, containers, schedule) are read from the settings when the host indexes the
functions; so is the retention rule, which refuses to start when markers would expire too early.

Every function is ``async def``: the worker runs them all on its one event loop, where the async
clients live (measured: README "Performance", async against sync).
"""

from __future__ import annotations

import functools
import logging
import time

import azure.functions as func
from azurefunctions.extensions.bindings import servicebus

from consumers.binding import to_inbound
from consumers.settlement import ActionsSettlement
from shared import bootstrap
from shared.delivery import run_delivery
from shared.domain.messages import InboundMessage
from shared.domain.outcomes import Result
from shared.handlers import reports
from shared.handlers.apply_event import apply_order_event
from shared.handlers.outbox import OutboxPublisher, PublishReport
from shared.handlers.place_order import OrderServices, place_order

logger = logging.getLogger("idempotent_consumer.functions")
_settings = bootstrap.services().settings
# Raising here fails the functions' indexing, with the computation in the error.
_settings.retention.check()

blueprint = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions 1.x is untyped here


async def handle_order(message: InboundMessage) -> Result:
    """Apply one OrderPlaced delivery with the process's services."""
    app = bootstrap.services()
    return await place_order(message, OrderServices(app.order_store(), app.fulfilment_service(), app.settings))


async def handle_event(message: InboundMessage) -> Result:
    """Apply one lifecycle event with the process's services."""
    app = bootstrap.services()
    return await apply_order_event(message, app.order_store(), app.settings)


def _abandon_delay() -> float:
    return bootstrap.services().settings.abandon_delay_seconds


def publisher() -> OutboxPublisher:
    """The outbox publisher over the process's store and sender."""
    app = bootstrap.services()
    return OutboxPublisher(
        app.order_store(), app.message_sender(), dispatched_ttl_seconds=app.settings.outbox_dispatched_ttl_seconds
    )


@blueprint.function_name("process_order")
@blueprint.service_bus_queue_trigger(
    arg_name="msg", queue_name=_settings.orders_queue, connection="ServiceBusConnection",
    auto_complete_messages=False,
)
async def process_order(
    msg: servicebus.ServiceBusReceivedMessage, message_actions: servicebus.ServiceBusMessageActions
) -> None:
    """Service Bus trigger (PeekLock): settle every delivery explicitly, exactly once."""
    await run_delivery("process_order", functools.partial(to_inbound, msg), handle_order,
                       ActionsSettlement(msg, message_actions), abandon_delay=_abandon_delay())


@blueprint.function_name("process_order_event")
@blueprint.service_bus_queue_trigger(
    arg_name="msg", queue_name=_settings.order_events_queue, connection="ServiceBusConnection",
    is_sessions_enabled=True, auto_complete_messages=False,
)
async def process_order_event(
    msg: servicebus.ServiceBusReceivedMessage, message_actions: servicebus.ServiceBusMessageActions
) -> None:
    """Service Bus session trigger (PeekLock): settle every delivery explicitly, exactly once."""
    await run_delivery("process_order_event", functools.partial(to_inbound, msg), handle_event,
                       ActionsSettlement(msg, message_actions), abandon_delay=_abandon_delay())


def _log(function: str, report: PublishReport) -> None:
    logger.info(
        "%s dispatched=%d failed=%d skipped=%d", function, len(report.dispatched), len(report.failed), report.skipped,
        extra={"function": function, "dispatched": len(report.dispatched), "failed": len(report.failed)},
    )


@blueprint.function_name("publish_outbox")
@blueprint.cosmos_db_trigger(
    arg_name="documents", connection="CosmosDBConnection", database_name=_settings.cosmos_database,
    container_name=_settings.cosmos_container, lease_container_name=_settings.cosmos_leases_container,
    create_lease_container_if_not_exists=False,
)
async def publish_outbox(documents: func.DocumentList) -> None:
    """Change feed of the orders container: send each pending outbox entry, then mark it dispatched.

    An entry that cannot be sent stays pending for sweep_outbox; the change feed does not retry.
    """
    _log("publish_outbox", await publisher().publish(doc.to_dict() for doc in documents))


@blueprint.function_name("sweep_outbox")
@blueprint.timer_trigger(arg_name="timer", schedule=_settings.outbox_sweep_schedule, run_on_startup=False)
async def sweep_outbox(timer: func.TimerRequest) -> None:
    """Publish outbox entries still pending after OUTBOX_STUCK_AFTER_SECONDS: a missed feed batch is not lost."""
    settings = bootstrap.services().settings
    _log("sweep_outbox", await publisher().sweep(stuck_after_seconds=settings.outbox_stuck_after_seconds))


@blueprint.function_name("report_stuck")
@blueprint.timer_trigger(arg_name="timer", schedule=_settings.stuck_report_schedule, run_on_startup=False)
async def report_stuck(timer: func.TimerRequest) -> None:
    """Log and count events parked past PARKED_ALERT_AFTER_SECONDS and side effects stuck in progress."""
    app = bootstrap.services()
    settings = app.settings
    found = await reports.report_stuck(app.order_store(), consumer=settings.consumer_name, now=time.time(),
                                 parked_after=settings.parked_alert_after_seconds,
                                 stuck_after=settings.side_effect_stuck_after_seconds)
    logger.info("report_stuck parked=%d sideEffects=%d", len(found.parked), len(found.side_effects),
                extra={"function": "report_stuck", "parked": len(found.parked), "stuck": len(found.side_effects)})
