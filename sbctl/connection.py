"""Open a ServiceBusClient from the command line's options, and turn SDK failures into plain errors."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from azure.core.exceptions import AzureError, ClientAuthenticationError
from azure.servicebus import ServiceBusClient
from azure.servicebus.exceptions import (
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusConnectionError,
    ServiceBusError,
)

CONNECTION_ENV = "SERVICEBUS_CONNECTION_STRING"


class ToolError(Exception):
    """A failure the operator can act on; printed without a stack trace."""


def open_client(connection_string: str | None, namespace: str | None) -> ServiceBusClient:
    """A client from --connection-string (or $SERVICEBUS_CONNECTION_STRING), or --namespace with Entra ID.

    Retries are few: a tool should fail fast on a bad endpoint rather than retry for a minute.
    """
    connection_string = connection_string or os.environ.get(CONNECTION_ENV)
    if namespace:
        from azure.identity import DefaultAzureCredential  # noqa: PLC0415 - only for --namespace

        return ServiceBusClient(namespace, DefaultAzureCredential(), retry_total=1, retry_backoff_factor=0.5)
    if not connection_string:
        raise ToolError(f"give --connection-string, set {CONNECTION_ENV}, or give --namespace")
    try:
        return ServiceBusClient.from_connection_string(connection_string, retry_total=1, retry_backoff_factor=0.5)
    except (ValueError, TypeError) as exc:
        raise ToolError(f"bad connection string: {exc}") from None


@contextmanager
def translated(entity: str) -> Iterator[None]:
    """Map SDK exceptions to ToolError with what went wrong and where."""
    try:
        yield
    except MessagingEntityNotFoundError:
        raise ToolError(f"entity {entity!r} does not exist in the namespace") from None
    except (ServiceBusAuthenticationError, ServiceBusAuthorizationError, ClientAuthenticationError) as exc:
        raise ToolError(f"not authorised for {entity!r}: {type(exc).__name__}") from None
    except (ServiceBusConnectionError, OperationTimeoutError) as exc:
        raise ToolError(f"cannot reach Service Bus for {entity!r}: {type(exc).__name__}") from None
    except (ServiceBusError, AzureError) as exc:
        raise ToolError(f"Service Bus error on {entity!r}: {type(exc).__name__}: {exc}") from None
