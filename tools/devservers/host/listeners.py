"""A listener per function, chosen by its trigger, connected by the trigger's ``connection`` setting.

A connection setting ``X`` is a connection string in ``X`` (local emulators), or an identity-based
connection in ``X__fullyQualifiedNamespace`` (Service Bus) or ``X__accountEndpoint`` (Cosmos DB) used
with ``DefaultAzureCredential``, as the host resolves them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from azure.servicebus import ServiceBusClient

from devservers.host.process import Function, HostError
from devservers.host.servicebus import RELEASE_RATE_SETTING, ServiceBusListener
from devservers.host.timers import TimerListener

if TYPE_CHECKING:
    from devservers.host.core import Host, Listener

logger = logging.getLogger("devservers.host")


def listeners_for(host: Host) -> list[Listener]:
    """One listener per function whose trigger this host knows; a warning for any other."""
    found: list[Listener] = []
    for function in host.functions:
        if function.trigger_type == "serviceBusTrigger":
            client = servicebus_client(host.config.settings, function)
            release_rate = float(host.config.settings.get(RELEASE_RATE_SETTING) or 0)
            found.append(ServiceBusListener(function, client, host.config.service_bus(), host.deliveries,
                                            host.invoke, release_rate=release_rate))
        elif function.trigger_type == "timerTrigger":
            found.append(TimerListener.for_function(function, host.config, host.invoke))
        elif function.trigger_type == "cosmosDBTrigger":
            from devservers.host.changefeed import ChangeFeedListener  # noqa: PLC0415 - only apps that use it

            found.append(ChangeFeedListener.for_function(function, host.config.settings, host.invoke))
        else:
            logger.warning("%s: the local host has no %s; it is not run", function.name, function.trigger_type)
    return found


def servicebus_client(settings: dict[str, str], function: Function) -> ServiceBusClient:
    """The client for a Service Bus trigger's connection setting."""
    name = str(function.trigger.get("connection") or "AzureWebJobsServiceBus")
    # No retries for "no session available": a session slot simply asks again.
    options: dict[str, Any] = {"retry_total": 0 if function.trigger.get("isSessionsEnabled") else 3}
    if connection_string := settings.get(name):
        return ServiceBusClient.from_connection_string(connection_string, **options)
    if namespace := settings.get(f"{name}__fullyQualifiedNamespace"):
        from azure.identity import DefaultAzureCredential  # noqa: PLC0415 - only for identity connections

        return ServiceBusClient(namespace, DefaultAzureCredential(), **options)
    raise HostError(f"{function.name}: set {name} (a connection string) or {name}__fullyQualifiedNamespace")
