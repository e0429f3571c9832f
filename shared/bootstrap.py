"""The composition root: ``build`` wires the handlers and the delivery policy over one set of ports.

Everything that runs the core builds its ``App`` here: the functions (``function_app.py``, once, on
the first invocation), the simulator and the benchmarks (with their fakes handed in), the operator
tools, the tests. The wiring of each handler to its ports is written once, in ``App``'s methods.

Nothing connects at build time, because under Azure Functions import happens while the host indexes
the functions. A port not handed in is made on first use from the settings; its module (aiohttp
above all) is imported then too, so the first invocation pays for it (README "Performance", cold
start). The clients are async, each bound to the event loop it first runs in, which under Functions
is the worker's one loop for every invocation; ``aclose`` closes the ones the app made.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

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
from idempotent_consumer.ordered.writes import Releases
from idempotent_consumer.outbox import OutboxPublisher
from idempotent_consumer.outcomes import Result
from idempotent_consumer.ports.sender import MessageSender
from idempotent_consumer.ports.store import DocumentStore
from idempotent_consumer.ports.watched import watched_store
from idempotent_consumer.retries import Backoff
from idempotent_consumer.telemetry import export_to_azure_monitor, record_delivery
from shared.handlers.apply_event import apply_order_event, check_event
from shared.handlers.place_order import OrderServices, check_order, place_order
from shared.ports.fulfilment import FulfilmentService
from shared.ports.watched import watched_fulfilment
from shared.settings import Settings

_Client = TypeVar("_Client")


class App:
    """The handlers and the delivery policy, bound to one set of settings, ports and clock."""

    def __init__(self, settings: Settings, *, store: DocumentStore | None, fulfilment: FulfilmentService | None,
                 sender: MessageSender | None, clock: Clock, sleep: Sleep, record: Recorder,
                 releases: type[Releases] = Releases, complete: bool = False) -> None:
        self.settings = settings
        self._complete = complete
        self.clock = clock
        self._releases = releases
        self._store, self._fulfilment, self._sender = store, fulfilment, sender
        self._sleep = sleep
        self._record = record
        self._lock = threading.Lock()
        self._made: list[Any] = []
        self._breakers: dict[str, Breaker] = {}

    # -- the handlers, each wired to its ports here and nowhere else ---------------------------------

    # The handlers' ports are watched: what each attempt reached tells its breaker whether a probe may close it.
    async def handle_order(self, message: InboundMessage) -> Result:
        """Apply one OrderPlaced delivery."""
        return await place_order(message, OrderServices(watched_store(self.store()),
                                                        watched_fulfilment(self.fulfilment()), self.settings,
                                                        self.clock, self._releases))

    async def handle_event(self, message: InboundMessage) -> Result:
        """Apply one lifecycle event."""
        return await apply_order_event(message, watched_store(self.store()), self.settings, self.clock,
                                       self._releases)

    @property
    def checks(self) -> dict[Handler, Check]:
        """What each handler decides with no dependency (a message's own validity), for the delivery policy to
        decide first while a breaker is open."""
        return {self.handle_order: check_order, self.handle_event: check_event}

    def publisher(self) -> OutboxPublisher:
        """The outbox publisher over the store and the sender."""
        return OutboxPublisher(self.store(), self.sender(),
                               dispatched_ttl_seconds=self.settings.outbox_dispatched_ttl_seconds, clock=self.clock)

    async def report_stuck(self, now: float) -> reports.StuckReport:
        """Find, log and count the events parked and the side effects in progress for too long at ``now``."""
        settings = self.settings
        return await reports.report_stuck(self.store(), consumer=settings.consumer_name, now=now,
                                          parked_after=settings.parked_alert_after_seconds,
                                          stuck_after=settings.side_effect_stuck_after_seconds)

    async def deliver(self, function: str, read: Callable[[], InboundMessage], handler: Handler,
                      port: SettlementPort, *, queue: str) -> Settlement:
        """Run one delivery from ``queue`` through ``handler`` and settle it on ``port``: ``run_delivery`` with
        this app's retries (handed on to ``queue``, under the function's breaker), clock, sleep and recorder."""
        return await run_delivery(function, read, handler, port, retrying=self.retries(function, queue),
                                  clock=self.clock, sleep=self._sleep, record=self._record,
                                  check=self.checks.get(handler))

    @property
    def breakers(self) -> list[Breaker]:
        """The breakers this app made, one per function that delivered."""
        with self._lock:
            return list(self._breakers.values())

    def retries(self, function: str, queue: str) -> Retries:
        """How ``function``'s deliveries retry, as the settings say; its breaker is made once per app."""
        settings = self.settings
        with self._lock:
            breaker = self._breakers.setdefault(function, Breaker(function, window=settings.breaker_window,
                                                                  open_seconds=settings.breaker_open_seconds))
        backoff = Backoff(settings.retry_backoff_seconds, settings.retry_backoff_ceiling_seconds,
                          settings.retry_total_seconds) if settings.delayed_retries else None
        return Retries(wait=settings.abandon_delay_seconds, attempts=settings.retry_in_lock_attempts, backoff=backoff,
                       queue=queue, sender=self.sender, breaker=breaker if settings.delayed_retries else None)

    # -- the ports, handed in or made on first use ----------------------------------------------------
    # The function app's (``complete``) checks, as it makes its first port, that every required setting is set,
    # naming each missing one at once: inside the delivery that needs it, so that the delivery is settled as any
    # other that cannot reach its store. An app built with some ports of its own (tests, the simulator) makes
    # the others with ``Settings.need``, which names the one setting it needs.

    def store(self) -> DocumentStore:
        """The orders container's store (orders and their events share it)."""
        with self._lock:
            if self._store is None:
                self._check_complete()
                from idempotent_consumer.adapters.cosmos import CosmosStore  # noqa: PLC0415 - on first use, see above

                self._store = self._keep(CosmosStore.from_settings(self.settings))
            return self._store

    def fulfilment(self) -> FulfilmentService:
        """The fulfilment service's client, one pooled session per app."""
        with self._lock:
            if self._fulfilment is None:
                self._check_complete()
                from shared.adapters.http import HttpFulfilment  # noqa: PLC0415

                settings = self.settings
                self._fulfilment = self._keep(HttpFulfilment(
                    settings.need("fulfillment_url"), connect_timeout=settings.fulfillment_connect_timeout_seconds,
                    read_timeout=settings.fulfillment_read_timeout_seconds,
                    proxy_from_environment=settings.http_proxy_from_environment,
                ))
            return self._fulfilment

    def sender(self) -> MessageSender:
        """The Service Bus sender, connected on first send."""
        with self._lock:
            if self._sender is None:
                self._check_complete()
                from idempotent_consumer.adapters.servicebus import ServiceBusSender  # noqa: PLC0415

                self._sender = self._keep(ServiceBusSender.from_settings(self.settings))
            return self._sender

    async def aclose(self) -> None:
        """Close the clients this app made, in the loop they ran in; ports handed in stay open."""
        with self._lock:
            made, self._made = self._made, []
        for client in made:
            await client.close()

    def _check_complete(self) -> None:
        if self._complete:
            self.settings.complete()

    def _keep(self, client: _Client) -> _Client:
        self._made.append(client)
        return client


def build(
    settings: Settings, *, store: DocumentStore | None = None, fulfilment: FulfilmentService | None = None,
    sender: MessageSender | None = None, clock: Clock = time.time, sleep: Sleep = asyncio.sleep,
    record: Recorder = record_delivery, releases: type[Releases] = Releases,
) -> App:
    """The app over ``settings``: the ports handed in, or made from the settings on first use.

    ``clock`` is the handlers' and the delivery policy's time; ``sleep`` is the wait before an abandon;
    ``record`` logs and counts each delivery. The simulator hands in its own three. ``releases`` writes the
    releases of parked events in batches inside Cosmos DB's limits; the simulator's tests plant a broken one.
    """
    return App(settings, store=store, fulfilment=fulfilment, sender=sender, clock=clock, sleep=sleep, record=record,
               releases=releases)


def from_environment() -> App:
    """The app as the function app runs it: settings from the environment, and the counters exported to
    Application Insights when it is set (on the first invocation: function_app builds this once)."""
    export_to_azure_monitor()
    return App(Settings.from_env(), store=None, fulfilment=None, sender=None, clock=time.time, sleep=asyncio.sleep,
               record=record_delivery, complete=True)
