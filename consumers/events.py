"""The process_order_event function: order lifecycle events, per session, applied exactly once."""

from __future__ import annotations

import azure.functions as func
from azurefunctions.extensions.bindings import servicebus

from consumers import runtime
from consumers.delivery import run_delivery
from shared.apply_event import apply_order_event
from shared.messages import InboundMessage
from shared.outcomes import Result
from shared.settings import Retention, order_events_queue

FUNCTION_NAME = "process_order_event"

# Refuse to start when inbox markers would expire before a message can come back: raising here
# fails the function's indexing, with the computation in the error.
Retention.from_env().check()

blueprint = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions 1.x is untyped here


def handle_event(message: InboundMessage) -> Result:
    """Apply one lifecycle event to the configured store."""
    return apply_order_event(message, runtime.order_store(), runtime.event_settings())


@blueprint.function_name(FUNCTION_NAME)
@blueprint.service_bus_queue_trigger(
    arg_name="msg",
    queue_name=order_events_queue(),
    connection="ServiceBusConnection",
    is_sessions_enabled=True,
    auto_complete_messages=False,
)
def process_order_event(
    msg: servicebus.ServiceBusReceivedMessage, message_actions: servicebus.ServiceBusMessageActions
) -> None:
    """Service Bus session trigger (PeekLock): settle every delivery explicitly, exactly once."""
    run_delivery(FUNCTION_NAME, msg, message_actions, handle_event)
