"""The process_order function: OrderPlaced messages from Service Bus into Cosmos DB, effectively once."""

from __future__ import annotations

import azure.functions as func
from azurefunctions.extensions.bindings import servicebus

from consumers import runtime
from consumers.delivery import run_delivery
from shared.messages import InboundMessage
from shared.outcomes import Result
from shared.place_order import OrderServices, place_order
from shared.settings import orders_queue

FUNCTION_NAME = "process_order"

blueprint = func.Blueprint()  # type: ignore[no-untyped-call]  # azure-functions 1.x is untyped here


def handle_order(message: InboundMessage) -> Result:
    """Apply one OrderPlaced delivery to the configured store."""
    services = OrderServices(runtime.order_store(), runtime.fulfilment(), runtime.order_settings())
    return place_order(message, services)


@blueprint.function_name(FUNCTION_NAME)
@blueprint.service_bus_queue_trigger(
    arg_name="msg",
    queue_name=orders_queue(),
    connection="ServiceBusConnection",
    auto_complete_messages=False,
)
def process_order(
    msg: servicebus.ServiceBusReceivedMessage, message_actions: servicebus.ServiceBusMessageActions
) -> None:
    """Service Bus trigger (PeekLock): settle every delivery explicitly, exactly once."""
    run_delivery(FUNCTION_NAME, msg, message_actions, handle_order)
