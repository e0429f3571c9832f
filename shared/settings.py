"""App settings: each declared once, with its name, default, description and constraints.

``Settings`` is one frozen msgspec Struct; each field is declared by ``setting(...)``, which also
lists it in ``SETTINGS``. The README table, ``local.settings.sample.json`` and the infrastructure
checks are tested against that list. The environment is decoded in lax mode (``"60"`` is 60,
``"false"`` is False); every malformed value is named in one ConfigurationError.

The settings are a consumer's: ``Settings.from_env(prefix=...)`` reads each as ``{prefix}{NAME}``, so that
two consumers in one app set theirs apart (``PAYMENTS_ORDERS_QUEUE``...), but for the account's
(``account=True``: the Cosmos DB endpoint and key, the Service Bus connection, the proxy), which every consumer
of the app shares, read unprefixed. The order app's prefix is empty.

The function app checks its required settings as it makes its first client, on the first invocation that
needs one (``Settings.complete``, every missing one named at once); an app built with clients of its own
(tests, the simulator) checks each where it is needed (``Settings.need``). So the host indexing the
functions, which connects to nothing, needs none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from idempotent_consumer.errors import ConfigurationError
from idempotent_consumer.settings import Declarations, Name, Retention, Seconds, SettingSpec, Url

__all__ = ["SETTINGS", "Retention", "SettingSpec", "Settings", "setting"]


_DECLARED = Declarations()
SETTINGS: dict[str, SettingSpec] = _DECLARED.specs
setting = _DECLARED


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Every setting the app reads."""

    orders_queue: Name = setting("ORDERS_QUEUE", "orders", "Queue that `process_order` listens on.", in_azure=True)
    cosmos_endpoint: Url | None = setting("COSMOS_ENDPOINT", None, "Cosmos DB account endpoint URL.", required=True,
                                          account=True)
    cosmos_key: str | None = setting("COSMOS_KEY", None, "Account key, for local emulators only. Unset: the app's "
                                     "managed identity in Azure (`ManagedIdentityCredential`), the developer's "
                                     "sign-in elsewhere (`DefaultAzureCredential`).", account=True)
    cosmos_verify_tls: bool = setting("COSMOS_VERIFY_TLS", True, "Verify the Cosmos endpoint's TLS certificate; "
                                      "`false` only for local emulators.", account=True)
    cosmos_database: Name = setting("COSMOS_DATABASE", "sales", "Cosmos DB database name.", in_azure=True)
    cosmos_container: Name = setting("COSMOS_CONTAINER", "orders", "Container of orders, partitioned by "
                                     "`/orderId`.", in_azure=True)
    order_events_queue: Name = setting("ORDER_EVENTS_QUEUE", "order-events", "Queue that `process_order_event` "
                                       "listens on: session-enabled, or plain when ORDER_EVENTS_SESSIONS is false.",
                                       in_azure=True)
    order_events_sessions: bool = setting(
        "ORDER_EVENTS_SESSIONS", True, "`true`: the events queue requires sessions (SessionId = orderId) and a host "
        "serves `maxConcurrentSessions` orders at a time, each order's events one by one. `false`: a plain queue at "
        "`maxConcurrentCalls`, where two events of one order may run at once and the resequencer alone puts them in "
        "order. Must match the queue's RequiresSession.", in_azure=True)
    consumer_name: Name = setting("CONSUMER_NAME", "order-projection", "This consumer's name; inbox markers are "
                                  "keyed on it and the event.", in_azure=True)
    dedup_ttl_seconds: Seconds = setting("DEDUP_TTL_SECONDS", 777600, "Lifetime of inbox markers (9 days); must "
                                         "cover the retention window below.", in_azure=True)
    servicebus_lock_duration_seconds: Seconds = setting("SERVICEBUS_LOCK_DURATION_SECONDS", 60, "The queues' lock "
                                                        "duration, as configured on Service Bus.", in_azure=True)
    servicebus_max_delivery_count: Seconds = setting("SERVICEBUS_MAX_DELIVERY_COUNT", 10, "The queues' "
                                                     "MaxDeliveryCount, as configured on Service Bus.", in_azure=True)
    servicebus_message_ttl_seconds: Seconds = setting("SERVICEBUS_MESSAGE_TTL_SECONDS", 86400, "The queues' "
                                                      "default message time to live, as configured on Service Bus.",
                                                      in_azure=True)
    dlq_resubmit_grace_seconds: Annotated[int, msgspec.Meta(ge=0)] = setting(
        "DLQ_RESUBMIT_GRACE_SECONDS", 604800, "How long after dead-lettering an operator may still resubmit a "
        "message (7 days).", in_azure=True)
    fulfillment_url: Url | None = setting("FULFILLMENT_URL", None, "Fulfilment service base URL; `process_order` "
                                          "POSTs `{url}/reservations`.", required=True)
    fulfillment_connect_timeout_seconds: Seconds = setting("FULFILLMENT_CONNECT_TIMEOUT_SECONDS", 3,
                                                           "Connect timeout of the fulfilment call.")
    fulfillment_read_timeout_seconds: Seconds = setting("FULFILLMENT_READ_TIMEOUT_SECONDS", 10,
                                                        "Read timeout of the fulfilment call.")
    fulfillment_token_scope: str | None = setting(
        "FULFILLMENT_TOKEN_SCOPE", None, "The fulfilment service's token scope (its application ID URI with "
        "`/.default`, `api://fulfilment/.default`): each call carries a bearer token of the app's managed identity "
        "for it, and a 401 or 403 is the service out of reach, not a bad message. Unset: no Authorization header.",
        in_azure=True)
    http_proxy_from_environment: bool = setting(
        "HTTP_PROXY_FROM_ENVIRONMENT", False, "Read `HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY` and `.netrc` from the "
        "environment on every Cosmos DB and fulfilment request (aiohttp's `trust_env`); `true` behind a proxy. Off, "
        "it saves a scan of the environment per request (see Performance).", account=True)
    abandon_delay_seconds: Annotated[float, msgspec.Meta(ge=0)] = setting(
        "ABANDON_DELAY_SECONDS", 10.0, "How long a delivery waits inside its lock before it tries a message "
        "again (`transient`) or abandons it (`error`, or `transient` with DELAYED_RETRIES false), so that retries "
        "are spread out; capped by the lock.")
    delayed_retries: bool = setting(
        "DELAYED_RETRIES", True, "`true`: a message still failing transiently after RETRY_IN_LOCK_ATTEMPTS is "
        "handed on, as a copy scheduled on its own queue, and the delivery completed. `false`: it is abandoned, "
        "and dead-lettered `MaxDeliveryCountExceeded` once the queue's deliveries are spent.")
    retry_in_lock_attempts: Annotated[int, msgspec.Meta(ge=1)] = setting(
        "RETRY_IN_LOCK_ATTEMPTS", 3, "How many times one delivery tries a message that fails transiently, "
        "ABANDON_DELAY_SECONDS apart, before it hands it on.")
    retry_backoff_seconds: Annotated[float, msgspec.Meta(gt=0)] = setting(
        "RETRY_BACKOFF_SECONDS", 10.0, "The delay before the first handed-on copy is due; each later one waits "
        "twice as long as the one before (jittered by up to a fifth), up to RETRY_BACKOFF_CEILING_SECONDS.")
    retry_backoff_ceiling_seconds: Annotated[float, msgspec.Meta(gt=0)] = setting(
        "RETRY_BACKOFF_CEILING_SECONDS", 900.0, "The longest delay between two handed-on copies of a message.")
    retry_total_seconds: Seconds = setting(
        "RETRY_TOTAL_SECONDS", 14400, "How long a message is handed on, from its first hand-on: past it, the "
        "delivery dead-letters it `RetryLimitExceeded`, saying how long it was tried (4 hours). Counts in the "
        "retention window.", in_azure=True)
    breaker_window: Annotated[int, msgspec.Meta(ge=2)] = setting(
        "BREAKER_WINDOW", 20, "How many recent attempts of a queue's deliveries the circuit breaker weighs: it "
        "opens when at least half of them failed with the dependency down (unreachable, 5xx or 429; a 409 for a key "
        "in flight or a read timeout shows it up, and does not count).")
    breaker_open_seconds: Annotated[float, msgspec.Meta(ge=0)] = setting(
        "BREAKER_OPEN_SECONDS", 30.0, "While the breaker is open, deliveries hand their messages on untried, "
        "but for one probe this often, and the last delivery before RETRY_TOTAL_SECONDS; a probe that finds the "
        "dependency up closes it. 0: no breaker.")
    side_effect_lease_seconds: Seconds = setting("SIDE_EFFECT_LEASE_SECONDS", 60, "Longest lease of an in-progress "
                                                 "side effect; also capped by the message lock.")
    reservation_claim_in_order: bool = setting(
        "RESERVATION_CLAIM_IN_ORDER", False, "Write a new order's reservation claim inside the order document (its "
        "`reservationClaim` field) instead of a document of its own: one write fewer per order. Every release from "
        "this one reads both forms; turn it on only once no earlier release runs (docs/operations.md, \"The "
        "reservation claim inside the order\").")
    parked_set_aside_ttl_seconds: Seconds = setting(
        "PARKED_SET_ASIDE_TTL_SECONDS", 604800, "Lifetime of a parked event set aside for good: rejected on "
        "release (its order's state forbade it) or dropped by an operator (7 days). Kept that long for "
        "`sbctl parked list`, then removed, so that what is set aside never fills the container.")
    parked_alert_after_seconds: Seconds = setting("PARKED_ALERT_AFTER_SECONDS", 900, "Age at which `report_stuck` "
                                                  "reports an event still parked waiting for its predecessor.")
    side_effect_stuck_after_seconds: Seconds = setting("SIDE_EFFECT_STUCK_AFTER_SECONDS", 300, "Time past its lease"
                                                       " at which `report_stuck` reports a side effect still in "
                                                       "progress.")
    stuck_report_schedule: Name = setting("STUCK_REPORT_SCHEDULE", "0 */5 * * * *", "NCRONTAB schedule of "
                                          "`report_stuck`.")
    outbox_destination: Name = setting("OUTBOX_DESTINATION", "order-accepted", "Queue or topic that OrderAccepted "
                                       "messages are published to: an order whose stock is reserved.", in_azure=True)
    outbox_rejected_destination: Name = setting(
        "OUTBOX_REJECTED_DESTINATION", "order-rejected", "Queue or topic that OrderRejected messages are published "
        "to: an order whose reservation the fulfilment service refused for good.", in_azure=True)
    outbox_requires_session: bool = setting("OUTBOX_REQUIRES_SESSION", False, "Set SessionId = orderId on outgoing "
                                            "messages (session-enabled destination).")
    outbox_dispatched_ttl_seconds: Annotated[int, msgspec.Meta(ge=0)] = setting(
        "OUTBOX_DISPATCHED_TTL_SECONDS", 0, "0: an outbox document is deleted once sent. Above 0: it is kept, "
        "marked dispatched, for that many seconds.")
    outbox_stuck_after_seconds: Seconds = setting("OUTBOX_STUCK_AFTER_SECONDS", 120, "Age at which `sweep_outbox` "
                                                  "publishes a still-pending outbox document. With the sweep's "
                                                  "period it bounds how late a resend follows a lost delete "
                                                  "(or mark): keep the two well inside the destination's "
                                                  "duplicate-detection window (PT10M in Bicep).")
    outbox_sweep_schedule: Name = setting("OUTBOX_SWEEP_SCHEDULE", "0 */2 * * * *", "NCRONTAB schedule of "
                                          "`sweep_outbox`.")
    cosmos_leases_container: Name = setting("COSMOS_LEASES_CONTAINER", "leases", "Lease container of "
                                            "`publish_outbox`'s change-feed trigger.", in_azure=True)
    servicebus_connection: str | None = setting("ServiceBusConnection", None, "Service Bus connection string, for "
                                                "local emulators only. The triggers read it too (through the host).",
                                                account=True)
    servicebus_namespace: str | None = setting(
        "ServiceBusConnection__fullyQualifiedNamespace", None, "Service Bus namespace host; managed identity is "
        "used (triggers and the outbox sender). One of the two is required.", in_azure=True, account=True)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, prefix: str = "") -> Settings:
        """Decode the settings from the environment (or ``env``), each a consumer's under ``prefix``; empty values
        count as unset. ConfigurationError naming every malformed value, as the environment spells it."""
        return _DECLARED.read(cls, env, prefix)

    def complete(self, prefix: str = "") -> Settings:
        """Return self when every required setting is set, else ConfigurationError naming each one that is not
        (after ``prefix``, the one the settings were read under): what the app checks when it is built, before it
        touches anything."""
        missing = _DECLARED.missing(self, prefix)
        if not (self.servicebus_connection or self.servicebus_namespace):
            missing.append(("ServiceBusConnection__fullyQualifiedNamespace",
                            "is required (or ServiceBusConnection for local emulators)"))
        if missing:
            raise ConfigurationError.of(missing)
        return self

    def name_of(self, attribute: str, prefix: str = "") -> str:
        """The environment variable an attribute is read from: its name after the consumer's ``prefix`` (but for
        the account's settings)."""
        name = msgspec.structs.fields(self)[_ATTRIBUTES.index(attribute)].encode_name
        return name if SETTINGS[name].account else prefix + name

    def need(self, attribute: str) -> Any:
        """The value of a setting the caller cannot work without; ConfigurationError naming it when unset."""
        value = getattr(self, attribute)
        if value is None:
            raise ConfigurationError(self.name_of(attribute), "is required but not set")
        return value

    @property
    def retention(self) -> Retention:
        """The retention rule over these settings."""
        return Retention(
            lock_duration_seconds=self.servicebus_lock_duration_seconds,
            max_delivery_count=self.servicebus_max_delivery_count,
            message_ttl_seconds=self.servicebus_message_ttl_seconds,
            resubmit_grace_seconds=self.dlq_resubmit_grace_seconds,
            dedup_ttl_seconds=self.dedup_ttl_seconds,
            retry_total_seconds=self.retry_total_seconds if self.delayed_retries else 0,
        )


_ATTRIBUTES = tuple(f.name for f in msgspec.structs.fields(Settings))
