"""Where sbctl connects, the ServiceBusClient for it, and SDK failures as one line naming the endpoint and cause."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from azure.core.exceptions import AzureError, ClientAuthenticationError
from azure.servicebus import ServiceBusClient
from azure.servicebus.exceptions import (
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusError,
)

from sbctl.failures import Cause, cause_of, first_line

CONNECTION_ENV = "SERVICEBUS_CONNECTION_STRING"
AMQP_PORT = 5672  # plain AMQP: the emulator and the local broker (UseDevelopmentEmulator=true)
AMQPS_PORT = 5671  # AMQP over TLS: Azure; the SDK then ignores any port in Endpoint
EMULATOR_FLAG = "UseDevelopmentEmulator=true"
_START_LOCAL = ("start the local broker (make run, or python -m devservers.servicebus "
                "--config infra/local/servicebus/Config.json --port 5672) or the emulator")


class ToolError(Exception):
    """A failure the operator can act on; printed as one line, without a stack trace."""


@dataclass(frozen=True)
class Target:
    """The namespace sbctl talks to, as the SDK will reach it: host, port, TLS or not, and the credential."""

    host: str
    port: int
    emulator: bool
    connection_string: str | None = field(default=None, repr=False)
    namespace: str | None = None

    @property
    def local(self) -> bool:
        """True for this machine (localhost, 127.0.0.0/8, ::1)."""
        if self.host.lower() == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host.strip("[]")).is_loopback
        except ValueError:
            return False

    def __str__(self) -> str:
        return f"{self.host}:{self.port} ({'plain AMQP' if self.emulator else 'AMQP over TLS'})"


def target_of(connection_string: str | None, namespace: str | None) -> Target:
    """The target of --connection-string (or $SERVICEBUS_CONNECTION_STRING), or of --namespace with Entra ID."""
    if namespace:
        host, _ = _host_port(namespace)
        return Target(host or namespace, AMQPS_PORT, emulator=False, namespace=namespace)
    connection_string = connection_string or os.environ.get(CONNECTION_ENV)
    if not connection_string:
        raise ToolError(f"give --connection-string, set {CONNECTION_ENV}, or give --namespace")
    settings = _settings(connection_string)
    endpoint = settings.get("endpoint", "")
    host, port = _host_port(endpoint)
    if not host:
        raise ToolError(f"bad connection string: Endpoint {endpoint!r} is not sb://<host>[:<port>]")
    emulator = settings.get("usedevelopmentemulator", "").lower() == "true"
    return Target(host, (port or AMQP_PORT) if emulator else AMQPS_PORT, emulator, connection_string)


def _host_port(address: str) -> tuple[str | None, int | None]:
    """``sb://host:port/`` or ``host`` -> (host, port); (None, None) if it is neither."""
    try:
        parts = urlsplit(address if "//" in address else f"//{address}")
        return parts.hostname, parts.port
    except ValueError:  # a port that is not a number
        return None, None


def _settings(connection_string: str) -> dict[str, str]:
    """The connection string's key=value pairs, keys lower-cased (the SDK reads them case-insensitively)."""
    pairs = [part.split("=", 1) for part in connection_string.strip().strip(";").split(";") if part.strip()]
    return {pair[0].strip().lower(): pair[1].strip() for pair in pairs if len(pair) == 2}


def open_client(target: Target) -> ServiceBusClient:
    """A client for the target. Retries are few: a tool should fail fast on a bad endpoint, not retry for a minute."""
    if target.namespace:
        from azure.identity import DefaultAzureCredential  # noqa: PLC0415 - only for --namespace

        return ServiceBusClient(target.namespace, DefaultAzureCredential(), retry_total=1, retry_backoff_factor=0.5)
    assert target.connection_string is not None
    try:
        return ServiceBusClient.from_connection_string(target.connection_string, retry_total=1,
                                                       retry_backoff_factor=0.5)
    except (ValueError, TypeError) as exc:
        raise ToolError(f"bad connection string: {exc}") from None


@contextmanager
def translated(target: Target, entity: str) -> Iterator[None]:
    """Map SDK exceptions to a ToolError naming the entity, the endpoint and the likely cause."""
    try:
        yield
    except MessagingEntityNotFoundError:
        raise ToolError(f"queue {entity!r} does not exist at {target}") from None
    except (ServiceBusAuthenticationError, ServiceBusAuthorizationError, ClientAuthenticationError) as exc:
        hint = (" (with Entra ID the identity needs an Azure Service Bus Data role on it)" if target.namespace
                else " (check the key in the connection string)")
        raise ToolError(f"not authorised for {entity!r} at {target}: {type(exc).__name__}{hint}") from None
    except (ServiceBusError, AzureError) as exc:
        if cause_of(exc) is None:
            raise ToolError(f"Service Bus error on {entity!r} at {target}: {first_line(exc)}") from None
        raise ToolError(f"cannot reach Service Bus at {target} for {entity!r}: {failure(target, exc)}") from None


def failure(target: Target, exc: BaseException) -> str:
    """The likely cause of a failed connection to ``target``, and what to change."""
    cause = cause_of(exc)
    if cause is Cause.REFUSED and target.emulator:
        return f"{cause.value}, nothing listens there; {_START_LOCAL}, or check the port in Endpoint"
    if cause in (Cause.REFUSED, Cause.TLS_TO_PLAIN, Cause.RESET) and target.local and not target.emulator:
        return (f"{cause.value}; the connection string lacks {EMULATOR_FLAG}, so the SDK used AMQP over TLS on "
                f"port {AMQPS_PORT} and ignored the port in Endpoint: add {EMULATOR_FLAG}; for the local broker "
                "or the emulator")
    if cause is Cause.REFUSED:
        return f"{cause.value}; check the namespace name and that outbound TCP {AMQPS_PORT} is open"
    if cause in (Cause.RESET, Cause.NOT_AMQP, Cause.TLS_TO_PLAIN) and target.emulator:
        return (f"{cause.value} at the AMQP handshake: this is not a plain-AMQP Service Bus endpoint (for Azure, "
                f"drop {EMULATOR_FLAG}; otherwise check the port)")
    if cause is Cause.UNRESOLVED:
        return f"{cause.value}; check the host in Endpoint or --namespace"
    if cause is Cause.TIMEOUT:
        return f"{cause.value}; check the address, the network and firewalls"
    return cause.value if cause is not None else first_line(exc)
