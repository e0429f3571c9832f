"""A library consumer's runtime: its settings, its ports (handed in, or made on first use), its breakers, and the
delivery policy over them. ``idempotent_consumer.functions.consumer`` builds one per consumer, on the first
invocation; a test or the simulation kit builds one with ports of its own.

Nothing connects at build time: under Azure Functions, import happens while the host indexes the functions. A
port not handed in is made on first use from the settings, its module imported then; the first invocation pays
for it. The clients are async, bound to the worker's one event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from idempotent_consumer import reports
from idempotent_consumer.breaker import Breaker
from idempotent_consumer.delivery import (
    Check,
    Clock,
    Handler,
    Recorder,
    Retries,
    Settlement,
    SettlementPort,
    Sleep,
    run_delivery,
)
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.outbox import OutboxPublisher, PublishReport
from idempotent_consumer.ports.partition import as_record, repartitioned
from idempotent_consumer.ports.sender import MessageSender
from idempotent_consumer.ports.store import DocumentStore
from idempotent_consumer.ports.watched import watched_store
from idempotent_consumer.retries import Backoff
from idempotent_consumer.telemetry import record_delivery

_Client = TypeVar("_Client")

if TYPE_CHECKING:
    from idempotent_consumer.adapters.cosmos import CosmosSettings
    from idempotent_consumer.adapters.servicebus import ServiceBusSettings
    from idempotent_consumer.ordered import Ordered
    from idempotent_consumer.plan import Intake, Scope
    from idempotent_consumer.settings import Retention

    class RuntimeSettings(CosmosSettings, ServiceBusSettings, Protocol):
        """What a runtime reads of its consumer's settings: ``ConsumerSettings`` has these, and so has an app's own
        settings class that declares them (the order app's ``Settings``)."""

        @property
        def side_effect_lease_seconds(self) -> int: ...
        @property
        def dedup_ttl_seconds(self) -> int: ...
        @property
        def breaker_window(self) -> int: ...
        @property
        def breaker_open_seconds(self) -> float: ...
        @property
        def retry_backoff_seconds(self) -> float: ...
        @property
        def retry_backoff_ceiling_seconds(self) -> float: ...
        @property
        def retry_total_seconds(self) -> int: ...
        @property
        def delayed_retries(self) -> bool: ...
        @property
        def abandon_delay_seconds(self) -> float: ...
        @property
        def retry_in_lock_attempts(self) -> int: ...
        @property
        def outbox_dispatched_ttl_seconds(self) -> int: ...
        @property
        def outbox_stuck_after_seconds(self) -> int: ...
        @property
        def parked_set_aside_ttl_seconds(self) -> int: ...
        @property
        def retention(self) -> Retention: ...
        @property
        def parked_alert_after_seconds(self) -> int: ...
        @property
        def side_effect_stuck_after_seconds(self) -> int: ...

        def complete(self, prefix: str = "") -> Any: ...


class Runtime:
    """One consumer's settings, ports, clock and breakers; ``store`` is its container as the plan sees it (the
    records' partition key under the container's own field)."""

    #: Where the consumer's effects may keep their claims inside their subjects' documents (``SideEffect.within``):
    #: the subjects' ``type`` and the field, for the stuck report to look there too. None: claims are records.
    claims_within: tuple[str, str] | None = None

    def __init__(self, name: str, settings: RuntimeSettings, *, partition_field: str, scope: Scope | None = None,
                 store: DocumentStore | None = None, sender: MessageSender | None = None, clock: Clock = time.time,
                 sleep: Sleep = asyncio.sleep, record: Recorder = record_delivery, prefix: str = "",
                 complete: bool = False) -> None:
        self.name, self.settings, self.prefix = name, settings, prefix
        self.partition_field, self.scope = partition_field, scope
        self.clock, self._sleep, self._record, self._complete = clock, sleep, record, complete
        self._store = None if store is None else repartitioned(store, partition_field)
        self._sender = sender
        self._lock = threading.Lock()
        self._made: list[Any] = []
        self._breakers: dict[str, Breaker] = {}

    def intake(self) -> Intake:
        """The plan's intake over this consumer's store (its module imported here: a consumer without plans, the
        order app, never pays for it)."""
        from idempotent_consumer.plan import Intake, Scope  # noqa: PLC0415

        settings = self.settings
        return Intake(watched_store(self.store()), self.name, lease_seconds=settings.side_effect_lease_seconds,
                      marker_ttl=settings.dedup_ttl_seconds, scope=self.scope or Scope.PARTITION,
                      partition_field=self.partition_field, clock=self.clock)

    def ordered(self, mode: Ordered) -> Ordered:
        """An ordered queue's ``mode`` as this runtime runs it: on its clock, with its settings' lifetimes."""
        settings = self.settings
        return dataclasses.replace(mode, clock=self.clock, dedup_ttl=settings.dedup_ttl_seconds,
                                   identity_ttl=settings.retention.identity_ttl_seconds,
                                   set_aside_ttl=settings.parked_set_aside_ttl_seconds)

    async def deliver(self, function: str, read: Callable[[], InboundMessage], handler: Handler,
                      port: SettlementPort, *, queue: str, check: Check | None = None) -> Settlement:
        """One delivery from ``queue`` through ``handler``, settled on ``port``."""
        return await run_delivery(function, read, handler, port, retrying=self.retries(function, queue),
                                  clock=self.clock, sleep=self._sleep, record=self._record, check=check)

    def retries(self, function: str, queue: str) -> Retries:
        """How ``function``'s deliveries retry, as the settings say; its breaker is made once."""
        settings = self.settings
        with self._lock:
            breaker = self._breakers.setdefault(function, Breaker(function, window=settings.breaker_window,
                                                                  open_seconds=settings.breaker_open_seconds))
        backoff = Backoff(settings.retry_backoff_seconds, settings.retry_backoff_ceiling_seconds,
                          settings.retry_total_seconds) if settings.delayed_retries else None
        return Retries(wait=settings.abandon_delay_seconds, attempts=settings.retry_in_lock_attempts, backoff=backoff,
                       queue=queue, sender=self.sender, breaker=breaker if settings.delayed_retries else None)

    async def publish(self, documents: Iterable[Mapping[str, Any]]) -> PublishReport:
        """Publish the pending outbox entries among a change-feed batch of the container."""
        return await self.publisher().publish(as_record(d, self.partition_field) for d in documents)

    def publisher(self) -> OutboxPublisher:
        """The outbox publisher over the store and the sender."""
        return OutboxPublisher(self.store(), self.sender(),
                               dispatched_ttl_seconds=self.settings.outbox_dispatched_ttl_seconds, clock=self.clock)

    @property
    def breakers(self) -> list[Breaker]:
        """The breakers this runtime made, one per function that delivered."""
        with self._lock:
            return list(self._breakers.values())

    async def report_stuck(self, now: float | None = None) -> reports.StuckReport:
        """Find, log and count the effects in progress for too long and the events parked too long, at ``now``
        (the clock's time when None)."""
        settings = self.settings
        return await reports.report_stuck(self.store(), consumer=self.name,
                                          now=self.clock() if now is None else now,
                                          parked_after=settings.parked_alert_after_seconds,
                                          stuck_after=settings.side_effect_stuck_after_seconds,
                                          claims_within=self.claims_within)

    def store(self) -> DocumentStore:
        """The consumer's container, made on first use."""
        with self._lock:
            if self._store is None:
                self._check_complete()
                from idempotent_consumer.adapters.cosmos import CosmosStore  # noqa: PLC0415 - on first use

                self._store = repartitioned(self._keep(CosmosStore.from_settings(self.settings)),
                                            self.partition_field)
            return self._store

    def sender(self) -> MessageSender:
        """The Service Bus sender, connected on first send."""
        with self._lock:
            if self._sender is None:
                self._check_complete()
                from idempotent_consumer.adapters.servicebus import ServiceBusSender  # noqa: PLC0415

                self._sender = self._keep(ServiceBusSender.from_settings(self.settings))
            return self._sender

    async def aclose(self) -> None:
        """Close the clients this runtime made; ports handed in stay open."""
        with self._lock:
            made, self._made = self._made, []
        for client in made:
            await client.close()

    def _check_complete(self) -> None:
        if self._complete:
            self.settings.complete(self.prefix)

    def _keep(self, client: _Client) -> _Client:
        self._made.append(client)
        return client
