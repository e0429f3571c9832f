"""``Consumer``: a Functions blueprint that gives a Service Bus-triggered handler effectively-once processing.

    ledger = Consumer("ledger-writer", container="ledger", partition_key="/accountId")

    @ledger.queue("payments", model=PaymentReceived, key=lambda p: p.payment_id)
    async def payment_received(p: PaymentReceived, ctx: Context) -> Plan:
        return Plan(create=[entry(p)], effect=Effect("credit", ...), on_done=lambda reply: [Send(...)])

    app = func.FunctionApp()
    app.register_functions(ledger)

The blueprint owns what a user could get wrong: each queue's trigger is PeekLock with
``auto_complete_messages=False`` and the SDK-type binding (the message and its actions), and every delivery
is settled explicitly, exactly once, through ``idempotent_consumer.delivery``. With it come the consumer's
companions: the outbox publisher on its container's change feed, the sweep for what the feed missed, and the
stuck report. The handler only decides: it gets the message decoded as ``model`` (msgspec: a Struct, a
dataclass, a TypedDict) and returns a ``Plan``, which the library writes (``idempotent_consumer.plan``). A queue
of ordered events is registered with ``ordered`` and a state machine instead (``idempotent_consumer.ordered``).

A message is decoded before the handler is called: a body that is not the model is dead-lettered
InvalidMessage naming msgspec's rule and path (never a value); a body over 256 KB, LimitExceeded. The key
(``key``, the MessageId by default) names the message; the partition (``partition``, by default the model's
field named by the container's partition key path) says where its writes go. The request hash covers the
key, the partition and the body as JSON, every field of it.

Settings are read under the consumer's ``prefix`` (``ConsumerSettings``), as the host indexes the functions;
the retention rule is checked per queue then, and a failure names the queue and the setting. The clients are
made on the first invocation, with every missing required setting named at once. The runtime's modules (the
delivery policy, the ports, the binding, the settlement, the telemetry) load then too: indexing loads only what
registering the functions needs.

An app with a history of its own (the order app) adopts the blueprint on its own terms: settings it read
(``settings``), a runtime it builds (``root``), the companions' names it already deployed (``Companions``), and
a queue whose decisions a plan cannot state registered with a handler of its own (``handler``), which the
library still triggers, runs through its delivery policy and settles.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

import azure.functions as func
import msgspec
from azurefunctions.extensions.bindings import servicebus

from idempotent_consumer import identity
from idempotent_consumer.functions import lock_renewal
from idempotent_consumer.messages import InboundMessage
from idempotent_consumer.ordered import Machine, Ordered
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.records import PARTITION_FIELD, RECORD_FIELDS
from idempotent_consumer.settings import ConsumerSettings

if TYPE_CHECKING:
    from idempotent_consumer.plan import Plan, Scope
    from idempotent_consumer.runtime import Runtime, RuntimeSettings

    class BlueprintSettings(RuntimeSettings, Protocol):
        """What the blueprint reads of its consumer's settings besides the runtime's: ``ConsumerSettings`` has
        these, and so has an app's own settings class that declares them (the order app's ``Settings``)."""

        @property
        def cosmos_container(self) -> str: ...
        @property
        def cosmos_leases_container(self) -> str: ...
        @property
        def outbox_sweep_schedule(self) -> str: ...
        @property
        def stuck_report_schedule(self) -> str: ...
        @property
        def servicebus_lock_duration_seconds(self) -> int: ...
        @property
        def servicebus_max_delivery_count(self) -> int: ...

logger = logging.getLogger("idempotent_consumer.functions")

M = TypeVar("M")
#: A message body the consumer takes, at most: Service Bus Standard's message, whatever the tier.
MAX_BODY_BYTES = 256 * 1024
# The outbox publisher's retry policy (the Functions host runs it for the Cosmos DB trigger, the checkpoint held): a
# batch whose invocation failed, its worker lost between a send and its entry's delete among the causes, is run
# again 5 s later, up to 5 times, so that what it sent goes again within seconds, inside the destination's detection
# window, rather than waiting for the sweep, a singleton timer that a lost instance holds back for up to two minutes.
PUBLISH_RETRY_COUNT, PUBLISH_RETRY_DELAY = "5", "00:00:05"
_PATH = re.compile(r"^/([A-Za-z_][A-Za-z0-9_]*)$")


@dataclass(frozen=True)
class Context:
    """What a handler knows of its delivery besides the message: its key, its partition, the broker's view of it
    (``message``: ids, delivery count, properties; never read the body here, the model is the body) and the time."""

    consumer: str
    key: str
    partition: str
    message: InboundMessage
    now: float


Handler: TypeAlias = "Callable[[Any, Context], Awaitable[Plan] | Plan]"
#: A handler of the app's own (``Consumer.handler``): the runtime and one delivery's message, decided.
OwnHandler = Callable[[Any, InboundMessage], Awaitable[Result]]


@dataclass(frozen=True)
class Companions:
    """The companion functions' names, and the prefix of the publisher's leases in the lease container. None: the
    consumer's own (``{name}_publish_outbox``..., leases under ``{name}.``). An app that deployed them under other
    names passes those, so that its function names and its publisher's leases (where the change feed resumes)
    stay as they were."""

    publish_outbox: str | None = None
    sweep_outbox: str | None = None
    report_stuck: str | None = None
    lease_prefix: str | None = None


@dataclass(frozen=True)
class Queue:
    """One queue's handler, as registered."""

    queue: str
    function: str
    model: type[Any]
    handler: Handler
    key: Callable[[Any], str] | None
    partition: Callable[[Any], str] | None
    sessions: bool


class Consumer(func.Blueprint):
    """A consumer's functions: one trigger per queue (``queue``), the outbox publisher, its sweep and the stuck
    report. ``container`` is partitioned by ``partition_key`` (a top-level path); ``scope`` says where a key is
    unique (``idempotent_consumer.plan.Scope``; None: within its partition); ``prefix`` is what its settings are
    read under.

    ``settings``: settings the app read itself, in place of ``ConsumerSettings`` (they name ``container``).
    ``root``: the runtime each invocation runs on, in place of the one the consumer builds from its settings;
    called on every invocation, so it builds once and keeps what it built (``functools.cache``).
    ``companions``: the companion functions' names (``Companions``)."""

    def __init__(self, name: str, *, container: str, partition_key: str, scope: Scope | None = None,
                 prefix: str = "", env: Mapping[str, str] | None = None,
                 service_bus_connection: str = "ServiceBusConnection",
                 cosmos_connection: str = "CosmosDBConnection", settings: BlueprintSettings | None = None,
                 root: Callable[[], Runtime] | None = None, companions: Companions | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        if (path := _PATH.match(partition_key)) is None:
            raise ValueError(f"partition_key {partition_key!r}: the library takes a top-level path, as /accountId")
        if path[1] in RECORD_FIELDS - {PARTITION_FIELD}:
            raise ValueError(f"partition_key {partition_key!r}: the library's records have a field {path[1]!r} of their"
                             " own; partition the container by another path")
        self.name, self.container, self.scope, self.prefix = name, container, scope, prefix
        self.partition_field = path[1]
        if settings is None:
            read = ConsumerSettings.from_env(env, prefix=prefix)
            settings = msgspec.structs.replace(read, cosmos_container=container)
        elif settings.cosmos_container != container:
            raise ValueError(f"container {container!r}: the settings handed in name {settings.cosmos_container!r}")
        self.settings: BlueprintSettings = settings
        self._service_bus_connection = service_bus_connection
        self.queues: dict[str, Queue] = {}
        self.ordered_queues: dict[str, tuple[str, Ordered]] = {}  # by function: the queue and its ordered mode
        self._runtime: Runtime | None = None
        self._root = root
        self._renewal = lock_renewal.renewal_seconds()
        self._companions(cosmos_connection, companions or Companions())

    # -- what a test or the simulation kit sets up -----------------------------------------------------------

    def use(self, runtime: Runtime) -> Runtime:
        """Run on ``runtime`` (ports of its own, a clock) from now on; returns it."""
        self._runtime = runtime
        return runtime

    def runtime(self, **ports: Any) -> Runtime:
        """The consumer's runtime: made on first use from the settings (the function app's), or with ``ports``
        (``store``, ``sender``, ``clock``, ``sleep``, ``record``) for a test, which then keeps it."""
        from idempotent_consumer.runtime import Runtime  # noqa: PLC0415 - with the first invocation, not the indexing

        if ports:
            return self.use(Runtime(self.name, self.settings, partition_field=self.partition_field, scope=self.scope,
                                    prefix=self.prefix, **ports))
        if self._runtime is None and self._root is not None:
            return self._root()
        if self._runtime is None:
            self._runtime = Runtime(self.name, self.settings, partition_field=self.partition_field, scope=self.scope,
                                    prefix=self.prefix, complete=True)
        return self._runtime

    # -- the queues --------------------------------------------------------------------------------------

    def queue(self, queue: str, *, model: type[M], key: Callable[[M], str] | None = None,
              partition: Callable[[M], str] | None = None, sessions: bool = False,
              function_name: str | None = None) -> Callable[[Handler], Handler]:
        """Register the decorated handler on ``queue``: PeekLock, settled by the library. ``key`` names the message
        (its MessageId when None); ``partition`` gives its partition (the model's field named by the partition key
        path when None); ``sessions`` for a session-enabled queue."""
        self.settings.retention.check(queue, self.prefix)

        def register(handler: Handler) -> Handler:
            name = function_name or handler.__name__
            entry = Queue(queue, name, model, handler, key, partition, sessions)
            self.queues[name] = entry
            self._trigger(entry)
            return handler
        return register

    def ordered(self, queue: str, machine: Machine[Any], *, sessions: bool = False,
                function_name: str | None = None) -> Ordered:
        """Register ordered processing of ``queue``'s events by ``machine`` (``idempotent_consumer.ordered``): each
        applied once and in sequence to its subject, in this consumer's container, an event before its turn parked
        and released in the batch of the one that makes it next. PeekLock, settled by the library. ``sessions``
        for a session-enabled queue (a session per subject), which delivers a subject's events one at a time."""
        self.settings.retention.check(queue, self.prefix)
        settings, name = self.settings, function_name or _stem(f"{self.name}_{queue}")
        mode = Ordered(machine, self.name, settings.dedup_ttl_seconds, settings.retention.identity_ttl_seconds,
                       settings.parked_set_aside_ttl_seconds)
        self.ordered_queues[name] = queue, mode
        self._bind(name, queue, sessions, functools.partial(self.apply, name), mode.check)
        return mode

    def handler(self, queue: str, handle: OwnHandler, *, function_name: str, check: Callable[[InboundMessage],
                Result | None] | None = None, sessions: bool = False) -> None:
        """Register a handler of the app's own on ``queue``, for decisions a plan cannot state: ``handle(runtime,
        message)`` returns the delivery's result; ``check(message)``, what needs no dependency to decide (the final
        result of a message it cannot take, else None). The library still owns the trigger (PeekLock), runs each
        delivery through its policy (retries, breaker) and settles it; the writes' atomicity is the handler's."""
        self.settings.retention.check(queue, self.prefix)

        async def run(message: InboundMessage) -> Result:
            return await handle(self.runtime(), message)
        self._bind(function_name, queue, sessions, run, check or _none)

    async def apply(self, function: str, message: InboundMessage) -> Result:
        """One delivery of ``function``'s ordered queue, decided by its machine."""
        runtime = self.runtime()
        mode = runtime.ordered(self.ordered_queues[function][1])
        from idempotent_consumer.ports.watched import watched_store  # noqa: PLC0415

        return await mode.apply(message, watched_store(runtime.store()))

    async def handle(self, function: str, message: InboundMessage) -> Result:
        """One delivery of ``function``'s queue, decided: decode, ask the handler for its plan, carry it out."""
        entry = self.queues[function]
        decoded = self.decode(entry, message)
        if isinstance(decoded, Result):
            return decoded
        model, key, partition, request_hash = decoded
        runtime = self.runtime()
        context = Context(self.name, key, partition, message, runtime.clock())
        try:
            plan = entry.handler(model, context)
            if inspect.isawaitable(plan):
                plan = await plan
        except Exception as exc:  # the same for every delivery of the message: settled once, with a reason
            return Result(Outcome.INVALID_PLAN, f"key {key}: the handler raised {type(exc).__name__}", request_hash)
        from idempotent_consumer.plan import Plan  # noqa: PLC0415 - loaded on first use: an app of no plan never pays

        if not isinstance(plan, Plan):
            return Result(Outcome.INVALID_PLAN, f"key {key}: the handler returned {type(plan).__name__}, not a Plan",
                          request_hash)
        return await runtime.intake().run(plan, key=key, partition=partition, message=message,
                                          request_hash=request_hash)

    def decode(self, entry: Queue, message: InboundMessage) -> tuple[Any, str, str, str] | Result:
        """The message as the handler takes it (model, key, partition, request hash), or the final result of one it
        cannot take: INVALID naming the rule, LIMIT_EXCEEDED naming the limit. Needs no dependency."""
        body = message.body
        if body is None:
            return Result(Outcome.INVALID, "the message has no data body (an AMQP value or sequence)")
        if len(body) > MAX_BODY_BYTES:
            return Result(Outcome.LIMIT_EXCEEDED, f"messageId {message.message_id}: a body of {len(body)} bytes;"
                                                  f" the consumer takes at most {MAX_BODY_BYTES}")
        try:
            model = msgspec.json.decode(body, type=entry.model)
            raw = msgspec.json.decode(body)  # every field, the model's or not, for the request hash
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return Result(Outcome.INVALID, f"body is not a {entry.model.__name__}: {_rule(exc)}")
        except RecursionError:
            return Result(Outcome.INVALID, f"body is not a {entry.model.__name__}: nested too deeply to parse")
        try:
            key = entry.key(model) if entry.key is not None else message.message_id
            partition: Any = None
            if entry.partition is not None:
                partition = entry.partition(model)
            elif isinstance(fields := msgspec.to_builtins(model), dict):
                partition = fields.get(self.partition_field)
        except Exception as exc:
            return Result(Outcome.INVALID, f"the message's key or partition could not be read: {type(exc).__name__}")
        if not isinstance(key, str) or not key:
            return Result(Outcome.INVALID, "the message's key is empty")
        if not isinstance(partition, str) or not partition:
            return Result(Outcome.INVALID, f"key {key}: the message names no {self.partition_field}, the partition"
                                           " its writes go to")
        return model, key, partition, identity.request_hash({"key": key, "partition": partition,
                                                             "body": _numbers_by_value(raw)})

    def check(self, function: str, message: InboundMessage) -> Result | None:
        """What needs no dependency to decide of a delivery of ``function``'s queue: the final result of a message
        its handler cannot take (its decoding), None for one fit to try. Decided first while the breaker is open."""
        return _final(self.decode(self.queues[function], message))

    # -- the functions -----------------------------------------------------------------------------------

    def _trigger(self, entry: Queue) -> None:
        self._bind(entry.function, entry.queue, entry.sessions, functools.partial(self.handle, entry.function),
                   functools.partial(self.check, entry.function))

    def _bind(self, function: str, queue: str, sessions: bool, handler: Callable[[InboundMessage], Awaitable[Result]],
              check: Callable[[InboundMessage], Result | None]) -> None:
        """The PeekLock trigger of ``queue``, its every delivery run through ``handler`` and settled by the library."""
        consumer, renewal = self, 0.0 if sessions else self._renewal

        @self.function_name(function)
        @self.service_bus_queue_trigger(arg_name="msg", queue_name=queue, connection=self._service_bus_connection,
                                        is_sessions_enabled=sessions or None, auto_complete_messages=False)
        async def trigger(msg: servicebus.ServiceBusReceivedMessage,
                          message_actions: servicebus.ServiceBusMessageActions) -> None:
            from idempotent_consumer.functions.binding import to_inbound  # noqa: PLC0415 - see the module's docstring
            from idempotent_consumer.functions.settlement import ActionsSettlement  # noqa: PLC0415

            await consumer.runtime().deliver(function, functools.partial(to_inbound, msg, renewal=renewal), handler,
                                             ActionsSettlement(msg, message_actions, sessions=sessions),
                                             queue=queue, check=check)

    def _companions(self, cosmos_connection: str, names: Companions) -> None:
        consumer, settings, stem = self, self.settings, _stem(self.name)
        publish = names.publish_outbox or f"{stem}_publish_outbox"
        sweep = names.sweep_outbox or f"{stem}_sweep_outbox"
        report = names.report_stuck or f"{stem}_report_stuck"
        lease_prefix = f"{self.name}." if names.lease_prefix is None else names.lease_prefix

        @self.function_name(publish)
        @self.retry(strategy="fixed_delay", max_retry_count=PUBLISH_RETRY_COUNT, delay_interval=PUBLISH_RETRY_DELAY)
        @self.cosmos_db_trigger(arg_name="documents", connection=cosmos_connection,
                                database_name=settings.cosmos_database, container_name=self.container,
                                lease_container_name=settings.cosmos_leases_container,
                                lease_container_prefix=lease_prefix or None,
                                create_lease_container_if_not_exists=False)
        async def publish_outbox(documents: func.DocumentList) -> None:
            """Change feed of the container: send each pending outbox entry, then delete it (or mark it). An entry
            that cannot be sent stays pending for the sweep; an invocation that fails (a worker lost mid-batch) is
            run again by the retry policy (PUBLISH_RETRY_COUNT), the checkpoint held."""
            _log(publish, await consumer.runtime().publish(document.to_dict() for document in documents))

        @self.function_name(sweep)
        @self.timer_trigger(arg_name="timer", schedule=settings.outbox_sweep_schedule, run_on_startup=False)
        async def sweep_outbox(timer: func.TimerRequest) -> None:
            """Publish outbox entries still pending after OUTBOX_STUCK_AFTER_SECONDS: a missed feed batch is not
            lost."""
            runtime = consumer.runtime()
            stuck_after = runtime.settings.outbox_stuck_after_seconds  # the runtime's: a test may run on its own
            _log(sweep, await runtime.publisher().sweep(stuck_after_seconds=stuck_after))

        @self.function_name(report)
        @self.timer_trigger(arg_name="timer", schedule=settings.stuck_report_schedule, run_on_startup=False)
        async def report_stuck(timer: func.TimerRequest) -> None:
            """Log and count events parked past PARKED_ALERT_AFTER_SECONDS and effects stuck in progress."""
            found = await consumer.runtime().report_stuck()
            logger.info("%s parked=%d sideEffects=%d", report, len(found.parked), len(found.side_effects),
                        extra={"function": report, "parked": len(found.parked), "stuck": len(found.side_effects)})


def _stem(name: str) -> str:
    """``name`` as a function's name: each character a name may not hold made ``_``."""
    return re.sub(r"\W", "_", name)


def _none(message: InboundMessage) -> None:
    """No check: every message is fit to try."""


def _final(decoded: tuple[Any, str, str, str] | Result) -> Result | None:
    """A decoding's final result, for the breaker's check; None for a message fit to try."""
    return decoded if isinstance(decoded, Result) else None


def _log(function: str, report: Any) -> None:
    logger.info("%s dispatched=%d failed=%d skipped=%d", function, len(report.dispatched), len(report.failed),
                report.skipped, extra={"function": function, "dispatched": len(report.dispatched),
                                       "failed": len(report.failed)})


def _rule(error: Exception) -> str:
    """msgspec's rule and path for a body that is not the model, without a value of it: an enum's or a literal's
    message quotes the value it met, which is the producer's data."""
    text = str(error)
    if text.startswith("Invalid enum value"):
        path = text.rsplit(" - at ", 1)
        return "Invalid enum value" + (f" - at {path[1]}" if len(path) == 2 else "")
    return text


def _numbers_by_value(value: Any) -> Any:
    """The body as its values: a number spelled ``1.0`` is the number ``1``, so that a producer's re-serialised
    copy hashes as the first did."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _numbers_by_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers_by_value(v) for v in value]
    return value
