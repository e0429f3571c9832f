"""Settings as declarations: each once, with its name, default, description and constraints; read from the
environment under a consumer's prefix, every malformed or missing value named in one error.

A settings class is a frozen msgspec Struct whose fields are declared by a ``Declarations`` (``declare(...)``),
which lists them for the docs and the checks. The environment is decoded in lax mode (``"60"`` is 60,
``"false"`` is False). A consumer's settings are read as ``{prefix}{NAME}``, so that two consumers in one app set
theirs apart, but for the account's (``account=True``: the Cosmos DB endpoint and key, the Service Bus
connection, the proxy), which every consumer of the app shares, read unprefixed.

``ConsumerSettings`` are what a consumer built on ``idempotent_consumer.consumer`` reads; the order app declares
its own the same way (``shared.settings``). ``Retention`` is the rule that a message can never come back after
its marker is gone.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import msgspec

from idempotent_consumer.errors import ConfigurationError

_S = TypeVar("_S", bound=msgspec.Struct)
_PATH = re.compile(r"^(?P<problem>.*) - at `\$\.(?P<name>[^`]+)`$")

Name = Annotated[str, msgspec.Meta(min_length=1, pattern=r"\S")]
Url = Annotated[str, msgspec.Meta(pattern=r"^https?://\S+$")]
Seconds = Annotated[int, msgspec.Meta(ge=1)]


@dataclass(frozen=True)
class SettingSpec:
    """One setting as declared: ``in_azure`` means the deployment (infra/) must set it; ``account`` that every
    consumer of the app shares it, so that it is read without a consumer's prefix."""

    name: str
    default: Any
    description: str
    required: bool
    in_azure: bool
    account: bool = False

    @property
    def default_text(self) -> str:
        """The default as the docs and the app settings spell it: ``required``, ``unset`` or the value."""
        if self.default is None:
            return "required" if self.required else "unset"
        if isinstance(self.default, bool):
            return str(self.default).lower()
        return str(self.default)


class Declarations:
    """The settings of one settings class, as declared; calling it declares one."""

    def __init__(self) -> None:
        self.specs: dict[str, SettingSpec] = {}

    def __call__(self, name: str, default: Any, description: str, *, required: bool = False, in_azure: bool = False,
                 account: bool = False) -> Any:
        """Declare a setting: a Struct field read from the environment variable ``name`` (after the consumer's
        prefix, but for an ``account`` one)."""
        self.specs[name] = SettingSpec(name, default, description, required, in_azure or required, account)
        return msgspec.field(default=default, name=name)

    def env_name(self, name: str, prefix: str) -> str:
        """The environment variable a setting is read from."""
        return name if self.specs[name].account else prefix + name

    def read(self, kind: type[_S], env: Mapping[str, str] | None, prefix: str) -> _S:
        """Decode ``kind`` from the environment (or ``env``), each setting under ``prefix``; empty values count as
        unset. ConfigurationError naming every malformed value, as the environment spells it."""
        source = os.environ if env is None else env
        values = {name: source[key].strip() for name in self.specs
                  if source.get(key := self.env_name(name, prefix), "").strip()}
        try:
            return msgspec.convert(values, kind, strict=False)
        except msgspec.ValidationError:
            problems = []
            for name, value in values.items():  # each alone, so that every one that is wrong is named
                try:
                    msgspec.convert({name: value}, kind, strict=False)
                except msgspec.ValidationError as exc:
                    problems.append(self._problem(exc, prefix))
            raise ConfigurationError.of(problems) from None

    def missing(self, settings: msgspec.Struct, prefix: str) -> list[tuple[str, str]]:
        """Each required setting that is not set, as the environment spells it."""
        return [(self.env_name(f.encode_name, prefix), "is required but not set")
                for f in msgspec.structs.fields(settings)
                if f.encode_name in self.specs and self.specs[f.encode_name].required
                and getattr(settings, f.name) is None]

    def _problem(self, exc: msgspec.ValidationError, prefix: str) -> tuple[str, str]:
        """The setting a field's error is about, as the environment spells it, and what is wrong with it."""
        match = _PATH.match(str(exc))
        if match is None:  # pragma: no cover - every field error of a flat Struct carries its path
            return "?", str(exc)
        return self.env_name(match["name"], prefix), match["problem"]


@dataclass(frozen=True)
class Retention:
    """How long the same message can come back, and how long the markers that recognise it live.

    A message can be redelivered for up to ``lock * max deliveries`` after its first processing, be
    handed on to later copies for up to the delayed retries' total limit, sit in the queue for up to its
    time to live, and be resubmitted from the dead-letter queue within the grace period. Markers must
    outlive all four, added up.
    """

    lock_duration_seconds: int
    max_delivery_count: int
    message_ttl_seconds: int
    resubmit_grace_seconds: int
    dedup_ttl_seconds: int
    retry_total_seconds: int = 0

    @property
    def required_seconds(self) -> int:
        """The shortest marker lifetime that covers every way a message can come back."""
        redeliveries = self.lock_duration_seconds * self.max_delivery_count
        return redeliveries + self.retry_total_seconds + self.message_ttl_seconds + self.resubmit_grace_seconds

    @property
    def identity_ttl_seconds(self) -> int:
        """How long an ordered event's identity lives: past its marker by as much as a redelivery or a delayed retry
        may come later, so that no key is ever checked against a marker alone."""
        return self.dedup_ttl_seconds + self.lock_duration_seconds * self.max_delivery_count + self.retry_total_seconds

    def check(self, queue: str | None = None, prefix: str = "") -> Retention:
        """Return self if markers live long enough, else raise ConfigurationError showing the computation (for
        ``queue``, when named, whose consumer's settings are read under ``prefix``)."""
        if self.dedup_ttl_seconds < self.required_seconds:
            raise ConfigurationError(f"{prefix}DEDUP_TTL_SECONDS", (
                ("" if queue is None else f"for queue {queue}, ") +
                f"{self.dedup_ttl_seconds} s is shorter than the retention window: lock {self.lock_duration_seconds} s"
                f" x {self.max_delivery_count} deliveries + delayed retries {self.retry_total_seconds} s + message TTL"
                f" {self.message_ttl_seconds} s + resubmit grace"
                f" {self.resubmit_grace_seconds} s = {self.required_seconds} s"))
        return self


CONSUMER = Declarations()
setting = CONSUMER


class ConsumerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What a library consumer reads, under its prefix (the account's unprefixed). Its container is the
    consumer's own, named in code (``cosmos_container``), not read."""

    cosmos_endpoint: Url | None = setting("COSMOS_ENDPOINT", None, "Cosmos DB account endpoint URL.", required=True,
                                          account=True)
    cosmos_key: str | None = setting("COSMOS_KEY", None, "Account key, for local emulators only. Unset: the app's "
                                     "managed identity in Azure, the developer's sign-in elsewhere.", account=True)
    cosmos_verify_tls: bool = setting("COSMOS_VERIFY_TLS", True, "Verify the Cosmos endpoint's TLS certificate; "
                                      "`false` only for local emulators.", account=True)
    http_proxy_from_environment: bool = setting(
        "HTTP_PROXY_FROM_ENVIRONMENT", False, "Read the proxy variables from the environment on every Cosmos DB "
        "request (aiohttp's `trust_env`); `true` behind a proxy.", account=True)
    servicebus_connection: str | None = setting("ServiceBusConnection", None, "Service Bus connection string, for "
                                                "local emulators only. The triggers read it too.", account=True)
    servicebus_namespace: str | None = setting(
        "ServiceBusConnection__fullyQualifiedNamespace", None, "Service Bus namespace host; managed identity is "
        "used (triggers and the outbox sender). One of the two is required.", in_azure=True, account=True)
    cosmos_database: Name = setting("COSMOS_DATABASE", "app", "Cosmos DB database of the consumer's container.",
                                    in_azure=True)
    cosmos_leases_container: Name = setting("COSMOS_LEASES_CONTAINER", "leases", "Lease container of the "
                                            "consumer's outbox publisher (a change-feed trigger).", in_azure=True)
    dedup_ttl_seconds: Seconds = setting("DEDUP_TTL_SECONDS", 777600, "Lifetime of a key's marker (9 days); must "
                                         "cover the retention window.", in_azure=True)
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
    abandon_delay_seconds: Annotated[float, msgspec.Meta(ge=0)] = setting(
        "ABANDON_DELAY_SECONDS", 10.0, "How long a delivery waits inside its lock before it tries a message again "
        "or abandons it; capped by the lock.")
    delayed_retries: bool = setting(
        "DELAYED_RETRIES", True, "`true`: a message still failing transiently after RETRY_IN_LOCK_ATTEMPTS is handed "
        "on, as a copy scheduled on its own queue. `false`: it is abandoned.")
    retry_in_lock_attempts: Annotated[int, msgspec.Meta(ge=1)] = setting(
        "RETRY_IN_LOCK_ATTEMPTS", 3, "How many times one delivery tries a message that fails transiently.")
    retry_backoff_seconds: Annotated[float, msgspec.Meta(gt=0)] = setting(
        "RETRY_BACKOFF_SECONDS", 10.0, "The delay before the first handed-on copy is due, doubled for each later one.")
    retry_backoff_ceiling_seconds: Annotated[float, msgspec.Meta(gt=0)] = setting(
        "RETRY_BACKOFF_CEILING_SECONDS", 900.0, "The longest delay between two handed-on copies of a message.")
    retry_total_seconds: Seconds = setting(
        "RETRY_TOTAL_SECONDS", 14400, "How long a message is handed on before it is dead-lettered "
        "`RetryLimitExceeded`. Counts in the retention window.", in_azure=True)
    breaker_window: Annotated[int, msgspec.Meta(ge=2)] = setting(
        "BREAKER_WINDOW", 20, "How many recent attempts of a queue's deliveries the circuit breaker weighs.")
    breaker_open_seconds: Annotated[float, msgspec.Meta(ge=0)] = setting(
        "BREAKER_OPEN_SECONDS", 30.0, "While the breaker is open, deliveries hand their messages on untried, but for "
        "one probe this often. 0: no breaker.")
    side_effect_lease_seconds: Seconds = setting("SIDE_EFFECT_LEASE_SECONDS", 60, "Longest lease of an effect's "
                                                 "claim; also capped by the message lock.")
    side_effect_stuck_after_seconds: Seconds = setting("SIDE_EFFECT_STUCK_AFTER_SECONDS", 300, "Time past its lease "
                                                       "at which the stuck report names an effect still in progress.")
    parked_set_aside_ttl_seconds: Seconds = setting(
        "PARKED_SET_ASIDE_TTL_SECONDS", 604800, "Ordered queues: lifetime of a parked event set aside for good, "
        "rejected on release or dropped by an operator (7 days).")
    parked_alert_after_seconds: Seconds = setting("PARKED_ALERT_AFTER_SECONDS", 900, "Ordered queues: age at which the "
                                                  "stuck report names an event still parked for its predecessor.")
    stuck_report_schedule: Name = setting("STUCK_REPORT_SCHEDULE", "0 */5 * * * *", "NCRONTAB schedule of the "
                                          "stuck report.")
    outbox_dispatched_ttl_seconds: Annotated[int, msgspec.Meta(ge=0)] = setting(
        "OUTBOX_DISPATCHED_TTL_SECONDS", 0, "0: an outbox entry is deleted once sent. Above 0: it is kept, "
        "marked dispatched, for that many seconds.")
    outbox_stuck_after_seconds: Seconds = setting("OUTBOX_STUCK_AFTER_SECONDS", 120, "Age at which the sweep "
                                                  "publishes a still-pending outbox entry.")
    outbox_sweep_schedule: Name = setting("OUTBOX_SWEEP_SCHEDULE", "0 */2 * * * *", "NCRONTAB schedule of the "
                                          "outbox sweep.")
    cosmos_container: str = ""  # the consumer's, from its code: not a setting

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, prefix: str = "") -> ConsumerSettings:
        """The settings from the environment (or ``env``), under ``prefix``; ConfigurationError naming every
        malformed value."""
        return CONSUMER.read(cls, env, prefix)

    def complete(self, prefix: str = "") -> ConsumerSettings:
        """Self when every required setting is set, else ConfigurationError naming each one that is not."""
        missing = CONSUMER.missing(self, prefix)
        if not (self.servicebus_connection or self.servicebus_namespace):
            missing.append(("ServiceBusConnection__fullyQualifiedNamespace",
                            "is required (or ServiceBusConnection for local emulators)"))
        if missing:
            raise ConfigurationError.of(missing)
        return self

    def need(self, attribute: str) -> Any:
        """The value of a setting the caller cannot work without; ConfigurationError naming it when unset."""
        value = getattr(self, attribute)
        if value is None:
            name = msgspec.structs.fields(self)[[f.name for f in msgspec.structs.fields(self)].index(attribute)]
            raise ConfigurationError(name.encode_name, "is required but not set")
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
