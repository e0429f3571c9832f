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
import dataclasses
import time
from collections.abc import Callable

from idempotent_consumer import reports
from idempotent_consumer.delivery import Check, Clock, Handler, Recorder, Settlement, SettlementPort, Sleep
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ordered import Ordered
from idempotent_consumer.ordered.writes import Releases
from idempotent_consumer.outcomes import Result
from idempotent_consumer.ports.sender import MessageSender
from idempotent_consumer.ports.store import DocumentStore
from idempotent_consumer.ports.watched import watched_store
from idempotent_consumer.records import PARTITION_FIELD
from idempotent_consumer.runtime import Runtime
from idempotent_consumer.telemetry import export_to_azure_monitor, record_delivery
from shared.handlers.apply_event import apply_order_event, check_event
from shared.handlers.place_order import RESERVATION_CLAIM, OrderServices, check_order, place_order
from shared.ports.fulfilment import FulfilmentService
from shared.ports.watched import watched_fulfilment
from shared.settings import Settings


class App(Runtime):
    """The handlers, bound to the library's runtime (one set of settings, ports, clock, breakers and the delivery
    policy over them) and to the fulfilment service."""

    settings: Settings
    claims_within = ("order", RESERVATION_CLAIM)

    def __init__(self, settings: Settings, *, store: DocumentStore | None, fulfilment: FulfilmentService | None,
                 sender: MessageSender | None, clock: Clock, sleep: Sleep, record: Recorder,
                 releases: type[Releases] = Releases, complete: bool = False) -> None:
        super().__init__(settings.consumer_name, settings, partition_field=PARTITION_FIELD,
                         store=store, sender=sender, clock=clock, sleep=sleep, record=record, complete=complete)
        self._fulfilment = fulfilment
        self._releases = releases

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

    def ordered(self, mode: Ordered) -> Ordered:
        """The events' ordered ``mode`` as this app runs it: on its clock, its releases written by ``releases``."""
        return dataclasses.replace(super().ordered(mode), releases=self._releases)

    @property
    def checks(self) -> dict[Handler, Check]:
        """What each handler decides with no dependency (a message's own validity), for the delivery policy to
        decide first while a breaker is open."""
        return {self.handle_order: check_order, self.handle_event: check_event}

    async def deliver(self, function: str, read: Callable[[], InboundMessage], handler: Handler,
                      port: SettlementPort, *, queue: str, check: Check | None = None) -> Settlement:
        """Run one delivery from ``queue`` through ``handler`` and settle it on ``port``: the library's delivery
        policy, with the handler's own check."""
        return await super().deliver(function, read, handler, port, queue=queue,
                                     check=check or self.checks.get(handler))

    async def report_stuck(self, now: float | None = None) -> reports.StuckReport:
        """Find, log and count the events parked and the side effects in progress for too long at ``now``."""
        return await super().report_stuck(now)

    def fulfilment(self) -> FulfilmentService:
        """The fulfilment service's client, one pooled session per app, made on first use."""
        with self._lock:
            if self._fulfilment is None:
                self._check_complete()
                from shared.adapters.http import HttpFulfilment  # noqa: PLC0415 - on first use, see above

                settings = self.settings
                self._fulfilment = self._keep(HttpFulfilment(
                    settings.need("fulfillment_url"), connect_timeout=settings.fulfillment_connect_timeout_seconds,
                    read_timeout=settings.fulfillment_read_timeout_seconds,
                    proxy_from_environment=settings.http_proxy_from_environment,
                    scope=settings.fulfillment_token_scope,
                ))
            return self._fulfilment


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
