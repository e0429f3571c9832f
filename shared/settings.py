"""App settings: one frozen object read from the environment, and the list of every setting read.

``SETTINGS`` is the single source for the names: the README table, ``local.settings.sample.json``
and the infrastructure checks are tested against it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from shared.errors import ConfigurationError


@dataclass(frozen=True)
class SettingSpec:
    """One app setting: its name, default (None = required or optional without default) and purpose."""

    name: str
    default: str | None
    description: str
    required: bool = False
    in_azure: bool = False  # the deployment (infra/) must set it: required, or it must agree with the infra


ORDERS_QUEUE = SettingSpec("ORDERS_QUEUE", "orders", "Queue that process_order listens on.", in_azure=True)
COSMOS_ENDPOINT = SettingSpec("COSMOS_ENDPOINT", None, "Cosmos DB account endpoint URL.", required=True, in_azure=True)
COSMOS_KEY = SettingSpec(
    "COSMOS_KEY", None, "Account key, for local emulators only. Unset: DefaultAzureCredential (managed identity)."
)
COSMOS_VERIFY_TLS = SettingSpec(
    "COSMOS_VERIFY_TLS", "true", "Verify the Cosmos endpoint's TLS certificate; false only for local emulators."
)
COSMOS_DATABASE = SettingSpec("COSMOS_DATABASE", "sales", "Cosmos DB database name.", in_azure=True)
COSMOS_CONTAINER = SettingSpec(
    "COSMOS_CONTAINER", "orders", "Container of orders, partitioned by /orderId.", in_azure=True
)

ORDER_EVENTS_QUEUE = SettingSpec(
    "ORDER_EVENTS_QUEUE", "order-events", "Session-enabled queue that process_order_event listens on.", in_azure=True
)
CONSUMER_NAME = SettingSpec(
    "CONSUMER_NAME",
    "order-projection",
    "This consumer's name; inbox markers are keyed on it and the event.",
    in_azure=True,
)
DEDUP_TTL_SECONDS = SettingSpec(
    "DEDUP_TTL_SECONDS",
    "777600",
    "Lifetime of inbox markers; must cover the retention window (see README).",
    in_azure=True,
)
OUT_OF_ORDER_MAX_DELIVERIES = SettingSpec(
    "OUT_OF_ORDER_MAX_DELIVERIES", "5", "Attempt at which an event still missing its predecessor is dead-lettered."
)
SERVICEBUS_LOCK_DURATION_SECONDS = SettingSpec(
    "SERVICEBUS_LOCK_DURATION_SECONDS", "60", "The queues' lock duration, as configured on Service Bus.", in_azure=True
)
SERVICEBUS_MAX_DELIVERY_COUNT = SettingSpec(
    "SERVICEBUS_MAX_DELIVERY_COUNT", "10", "The queues' MaxDeliveryCount, as configured on Service Bus.", in_azure=True
)
SERVICEBUS_MESSAGE_TTL_SECONDS = SettingSpec(
    "SERVICEBUS_MESSAGE_TTL_SECONDS", "86400", "The queues' default message time to live, as configured.", in_azure=True
)
DLQ_RESUBMIT_GRACE_SECONDS = SettingSpec(
    "DLQ_RESUBMIT_GRACE_SECONDS",
    "604800",
    "How long after dead-lettering an operator may still resubmit.",
    in_azure=True,
)

FULFILLMENT_URL = SettingSpec(
    "FULFILLMENT_URL",
    None,
    "Fulfilment service base URL; process_order POSTs {url}/reservations.",
    required=True,
    in_azure=True,
)
FULFILLMENT_CONNECT_TIMEOUT_SECONDS = SettingSpec(
    "FULFILLMENT_CONNECT_TIMEOUT_SECONDS", "3", "Connect timeout of the fulfilment call."
)
FULFILLMENT_READ_TIMEOUT_SECONDS = SettingSpec(
    "FULFILLMENT_READ_TIMEOUT_SECONDS", "10", "Read timeout of the fulfilment call."
)
SIDE_EFFECT_LEASE_SECONDS = SettingSpec(
    "SIDE_EFFECT_LEASE_SECONDS", "60", "Longest lease of an in-progress side effect; also capped by the message lock."
)
OUTBOX_DESTINATION = SettingSpec(
    "OUTBOX_DESTINATION",
    "order-accepted",
    "Queue or topic that OrderAccepted messages are published to.",
    in_azure=True,
)
OUTBOX_REQUIRES_SESSION = SettingSpec(
    "OUTBOX_REQUIRES_SESSION", "false", "Set SessionId = orderId on outgoing messages (session-enabled destination)."
)
OUTBOX_DISPATCHED_TTL_SECONDS = SettingSpec(
    "OUTBOX_DISPATCHED_TTL_SECONDS", "604800", "Lifetime of an outbox document after it was dispatched."
)
OUTBOX_STUCK_AFTER_SECONDS = SettingSpec(
    "OUTBOX_STUCK_AFTER_SECONDS", "300", "Age at which sweep_outbox publishes a still-pending outbox document."
)
OUTBOX_SWEEP_SCHEDULE = SettingSpec("OUTBOX_SWEEP_SCHEDULE", "0 */5 * * * *", "NCRONTAB schedule of sweep_outbox.")
COSMOS_LEASES_CONTAINER = SettingSpec(
    "COSMOS_LEASES_CONTAINER", "leases", "Lease container of publish_outbox's change-feed trigger.", in_azure=True
)
SERVICEBUS_CONNECTION = SettingSpec(
    "ServiceBusConnection", None, "Service Bus connection string, for local emulators only."
)
SERVICEBUS_NAMESPACE = SettingSpec(
    "ServiceBusConnection__fullyQualifiedNamespace",
    None,
    "Service Bus namespace host; managed identity is used.",
    in_azure=True,
)

SETTINGS: tuple[SettingSpec, ...] = (
    ORDERS_QUEUE,
    COSMOS_ENDPOINT,
    COSMOS_KEY,
    COSMOS_VERIFY_TLS,
    COSMOS_DATABASE,
    COSMOS_CONTAINER,
    ORDER_EVENTS_QUEUE,
    CONSUMER_NAME,
    DEDUP_TTL_SECONDS,
    OUT_OF_ORDER_MAX_DELIVERIES,
    SERVICEBUS_LOCK_DURATION_SECONDS,
    SERVICEBUS_MAX_DELIVERY_COUNT,
    SERVICEBUS_MESSAGE_TTL_SECONDS,
    DLQ_RESUBMIT_GRACE_SECONDS,
    FULFILLMENT_URL,
    FULFILLMENT_CONNECT_TIMEOUT_SECONDS,
    FULFILLMENT_READ_TIMEOUT_SECONDS,
    SIDE_EFFECT_LEASE_SECONDS,
    OUTBOX_DESTINATION,
    OUTBOX_REQUIRES_SESSION,
    OUTBOX_DISPATCHED_TTL_SECONDS,
    OUTBOX_STUCK_AFTER_SECONDS,
    OUTBOX_SWEEP_SCHEDULE,
    COSMOS_LEASES_CONTAINER,
    SERVICEBUS_CONNECTION,
    SERVICEBUS_NAMESPACE,
)

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


def read_setting(spec: SettingSpec, env: Mapping[str, str] | None = None) -> str | None:
    """Return the setting's value, its default, or raise ConfigurationError if it is required."""
    source = os.environ if env is None else env
    value = source.get(spec.name, "").strip()
    if value:
        return value
    if spec.required:
        raise ConfigurationError(spec.name, "is required but not set")
    return spec.default


def _read_bool(spec: SettingSpec, env: Mapping[str, str] | None) -> bool:
    value = (read_setting(spec, env) or "").lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigurationError(spec.name, f"must be true or false, not {value!r}")


def _read_name(spec: SettingSpec, env: Mapping[str, str] | None) -> str:
    value = read_setting(spec, env)
    if value is None:  # pragma: no cover - every name setting has a default
        raise ConfigurationError(spec.name, "is required but not set")
    return value


@dataclass(frozen=True)
class CosmosSettings:
    """Where and how to reach the orders container."""

    endpoint: str
    key: str | None
    verify_tls: bool
    database: str
    container: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CosmosSettings:
        """Read the Cosmos settings; a missing required one raises ConfigurationError naming it."""
        endpoint = _read_name(COSMOS_ENDPOINT, env)
        if not endpoint.startswith(("https://", "http://")):
            raise ConfigurationError(COSMOS_ENDPOINT.name, "must be an http(s) URL")
        return cls(
            endpoint=endpoint,
            key=read_setting(COSMOS_KEY, env),
            verify_tls=_read_bool(COSMOS_VERIFY_TLS, env),
            database=_read_name(COSMOS_DATABASE, env),
            container=_read_name(COSMOS_CONTAINER, env),
        )


def _read_int(spec: SettingSpec, env: Mapping[str, str] | None, minimum: int) -> int:
    value = _read_name(spec, env)
    try:
        number = int(value)
    except ValueError:
        raise ConfigurationError(spec.name, f"must be a whole number, not {value!r}") from None
    if number < minimum:
        raise ConfigurationError(spec.name, f"must be at least {minimum}, not {number}")
    return number


def orders_queue(env: Mapping[str, str] | None = None) -> str:
    """The queue process_order is bound to, read when the function is indexed."""
    return _read_name(ORDERS_QUEUE, env)


def order_events_queue(env: Mapping[str, str] | None = None) -> str:
    """The session queue process_order_event is bound to, read when the function is indexed."""
    return _read_name(ORDER_EVENTS_QUEUE, env)


@dataclass(frozen=True)
class Retention:
    """How long the same message can come back, and how long inbox markers live.

    A message can be redelivered for up to ``lock * max deliveries`` after its first processing, sit
    in the queue for up to its time to live, and be resubmitted from the dead-letter queue within the
    grace period. Markers must outlive all three, added up.
    """

    lock_duration_seconds: int
    max_delivery_count: int
    message_ttl_seconds: int
    resubmit_grace_seconds: int
    dedup_ttl_seconds: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Retention:
        """Read the retention settings; malformed values raise ConfigurationError naming them."""
        return cls(
            lock_duration_seconds=_read_int(SERVICEBUS_LOCK_DURATION_SECONDS, env, 1),
            max_delivery_count=_read_int(SERVICEBUS_MAX_DELIVERY_COUNT, env, 1),
            message_ttl_seconds=_read_int(SERVICEBUS_MESSAGE_TTL_SECONDS, env, 1),
            resubmit_grace_seconds=_read_int(DLQ_RESUBMIT_GRACE_SECONDS, env, 0),
            dedup_ttl_seconds=_read_int(DEDUP_TTL_SECONDS, env, 1),
        )

    @property
    def required_seconds(self) -> int:
        """The shortest marker lifetime that covers every way a message can come back."""
        return (
            self.lock_duration_seconds * self.max_delivery_count
            + self.message_ttl_seconds
            + self.resubmit_grace_seconds
        )

    def computation(self) -> str:
        """The rule with these numbers filled in, for error messages and logs."""
        return (
            f"lock {self.lock_duration_seconds} s x {self.max_delivery_count} deliveries"
            f" + message TTL {self.message_ttl_seconds} s + resubmit grace {self.resubmit_grace_seconds} s"
            f" = {self.required_seconds} s"
        )

    def check(self) -> Retention:
        """Return self if markers live long enough, else raise ConfigurationError showing the computation."""
        if self.dedup_ttl_seconds < self.required_seconds:
            raise ConfigurationError(
                DEDUP_TTL_SECONDS.name,
                f"{self.dedup_ttl_seconds} s is shorter than the retention window: {self.computation()}",
            )
        return self


@dataclass(frozen=True)
class EventSettings:
    """What process_order_event needs beyond the Cosmos settings."""

    consumer_name: str
    out_of_order_max_deliveries: int
    retention: Retention

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EventSettings:
        """Read and check the event consumer's settings."""
        return cls(
            consumer_name=_read_name(CONSUMER_NAME, env),
            out_of_order_max_deliveries=_read_int(OUT_OF_ORDER_MAX_DELIVERIES, env, 1),
            retention=Retention.from_env(env).check(),
        )


@dataclass(frozen=True)
class OrderSettings:
    """What process_order needs beyond the Cosmos settings: its name, the fulfilment call, the outbox."""

    consumer_name: str
    fulfillment_url: str
    connect_timeout_seconds: float
    read_timeout_seconds: float
    lease_seconds: int
    outbox_destination: str
    outbox_requires_session: bool

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OrderSettings:
        """Read process_order's settings; a missing or malformed one raises ConfigurationError naming it."""
        url = _read_name(FULFILLMENT_URL, env).rstrip("/")
        if not url.startswith(("https://", "http://")):
            raise ConfigurationError(FULFILLMENT_URL.name, "must be an http(s) URL")
        return cls(
            consumer_name=_read_name(CONSUMER_NAME, env),
            fulfillment_url=url,
            connect_timeout_seconds=_read_int(FULFILLMENT_CONNECT_TIMEOUT_SECONDS, env, 1),
            read_timeout_seconds=_read_int(FULFILLMENT_READ_TIMEOUT_SECONDS, env, 1),
            lease_seconds=_read_int(SIDE_EFFECT_LEASE_SECONDS, env, 1),
            outbox_destination=_read_name(OUTBOX_DESTINATION, env),
            outbox_requires_session=_read_bool(OUTBOX_REQUIRES_SESSION, env),
        )


@dataclass(frozen=True)
class OutboxSettings:
    """What the outbox publisher needs: where to send, how to connect, and when a document is stuck."""

    destination: str
    connection_string: str | None
    namespace: str | None
    dispatched_ttl_seconds: int
    stuck_after_seconds: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OutboxSettings:
        """Read the publisher's settings; one of the two Service Bus connection settings is required."""
        connection_string = read_setting(SERVICEBUS_CONNECTION, env)
        namespace = read_setting(SERVICEBUS_NAMESPACE, env)
        if not connection_string and not namespace:
            raise ConfigurationError(
                SERVICEBUS_NAMESPACE.name, f"is required (or {SERVICEBUS_CONNECTION.name} for local emulators)"
            )
        return cls(
            destination=_read_name(OUTBOX_DESTINATION, env),
            connection_string=connection_string,
            namespace=namespace,
            dispatched_ttl_seconds=_read_int(OUTBOX_DISPATCHED_TTL_SECONDS, env, 1),
            stuck_after_seconds=_read_int(OUTBOX_STUCK_AFTER_SECONDS, env, 1),
        )


def trigger_names(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Names the publish_outbox and sweep_outbox triggers bind to, read when the functions are indexed."""
    return {
        "database": _read_name(COSMOS_DATABASE, env),
        "container": _read_name(COSMOS_CONTAINER, env),
        "leases": _read_name(COSMOS_LEASES_CONTAINER, env),
        "schedule": _read_name(OUTBOX_SWEEP_SCHEDULE, env),
    }
