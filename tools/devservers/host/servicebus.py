"""Service Bus triggers: PeekLock receivers that hand each message to its function the way the host does.

Each concurrency slot is a thread with its own receiver while it holds one (so no receiver is used by two threads
but for settlement and lock renewal, as in the host; a queue's slots take turns to hold one while messages come one by
one, ``ReceiveTurns``): ``maxConcurrentCalls`` slots for a queue, or
``maxConcurrentSessions`` for a session queue, where a slot holds one session at a time and hands
over its messages one by one, and lets it go after ``sessionIdleTimeout`` without a message (as the
Functions host's session processor does; unset, that is the client's try timeout, 60 s). The message
goes to the worker in the host's ``model_binding_data`` layout (the 16-byte lock token, then the whole
encoded AMQP message). While the function runs the
message's lock (for a session, from its acceptance on, the session's lock) is renewed as the host renews it,
up to ``maxAutoLockRenewalDuration`` (``devservers.host.locks``), and the message can be settled through the
Settlement service. Afterwards the host's rules apply: a function that failed has its message
abandoned unless it settled it; one that succeeded is completed when ``autoCompleteMessages`` is
true, and otherwise left alone (its lock expires; a warning says so).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusReceivedMessage
from azure.servicebus._pyamqp._encode import encode_annotations, encode_payload, encode_value
from azure.servicebus._pyamqp.message import Header
from azure.servicebus._pyamqp.types import TYPE, VALUE, AMQPTypes
from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusError

from devservers.host.locks import LockRenewal
from devservers.host.process import Function
from devservers.host.protos import protos
from devservers.host.settlement import RELEASE_REQUESTED, Deliveries, Delivery

logger = logging.getLogger("devservers.host")
# How long one receive call of a slot waits for a message (a message that comes meanwhile is handed over at once):
# each call flows credit to the broker, so an idle slot costs the broker a flow this often; and it is how long a
# stop may wait for an idle slot to notice it. The extension's processor receives continuously. At 1 s, the flows
# of one idle host's slots were half the broker's idle CPU.
RECEIVE_WAIT_SECONDS = 2.0
# How many of a session trigger's slots ask for a session at once while sessions come one by one; the others wait
# for a turn, holding nothing. The SDK polls an accept's socket five times a second: 32 idle slots asking at once
# were half an idle host's CPU and a third of the broker's. The extension's processor has every free slot ask (a
# link each on one connection, no polling). Here an accept that finds a session waiting (it took less than
# QUICK_ACCEPT_SECONDS) lets every free slot ask, as there, and each accept that waited longer, or got none, closes
# one turn again, down to this. A burst after a quiet spell so waits one handshake longer than on Azure: in
# bench.events here, 80 orders' events drained at 39-40 a second against 51-62 with every slot always asking.
ACCEPTS_AT_ONCE = 2
QUICK_ACCEPT_SECONDS = 2.0
# How many of a queue trigger's slots hold a receiver while messages come one by one; the others hold nothing (no
# connection, no link, no credit) and wait for a turn. Each slot's receiver is a connection the SDK polls five times a
# second: 16 idle slots receiving at once were four fifths of an idle host's CPU (0.74 of 0.92 CPU-s in 30 s). The
# extension's processor has all its concurrent calls receive on one link of one connection, with no polling. Here a
# receive call that returns a message lets every slot hold a receiver, as there; each call that returns none closes
# one turn again, down to this, and its slot lets its receiver go. A burst after a quiet spell so waits one connection
# handshake per slot longer than on Azure.
RECEIVERS_AT_ONCE = 2
TURN_CHECK_SECONDS = 5.0  # how often a slot waiting for its turn looks for the stop (which does not wait for it)
# The client's TryTimeout when host.json's clientRetryOptions leaves it unset: ServiceBusRetryOptions.TryTimeout,
# "The default timeout is 1 minute" (learn.microsoft.com/dotnet/api/azure.messaging.servicebus.servicebusretryoptions).
TRY_TIMEOUT_SECONDS = 60.0
# A fault for the chaos suite, off unless set: the share of session messages whose session the slot lets go
# while the function still runs (azure-sdk-for-python #42187), so that another slot or host takes the session
# and the same message in parallel. The platform has no such setting.
RELEASE_RATE_SETTING = "DEVSERVERS_HOST_SESSION_RELEASE_RATE"
RELEASED_MID_INVOCATION = "let its session go mid-invocation (a chaos fault)"


@dataclass(frozen=True)
class ServiceBusOptions:
    """host.json ``extensions.serviceBus``, with the defaults the host uses."""

    max_concurrent_calls: int = 16
    max_concurrent_sessions: int = 8
    max_auto_lock_renewal_seconds: float = 300.0
    prefetch_count: int = 0
    auto_complete_messages: bool = True
    # None when host.json leaves sessionIdleTimeout unset: ServiceBusSessionProcessorOptions.SessionIdleTimeout,
    # "If not specified, the TryTimeout will be used" (learn.microsoft.com/dotnet/api/azure.messaging.servicebus.
    # servicebussessionprocessoroptions.sessionidletimeout); the extension passes its own setting through.
    session_idle_timeout_seconds: float | None = None
    try_timeout_seconds: float = TRY_TIMEOUT_SECONDS

    @property
    def session_idle_seconds(self) -> float:
        """How long a session slot waits for a session's next message before it lets the session go."""
        if self.session_idle_timeout_seconds is None:
            return self.try_timeout_seconds
        return self.session_idle_timeout_seconds


def model_binding_data(message: ServiceBusReceivedMessage) -> Any:
    """The message as the host hands it to the worker: the lock token, then the encoded AMQP message."""
    # The pyamqp Message the receiver decoded, every section of it (``.message`` is a uamqp-style wrapper).
    return binding_data(uuid.UUID(str(message.lock_token)), message._message)


def binding_data(token: uuid.UUID, amqp: Any) -> Any:
    """The host's ``model_binding_data`` of a pyamqp Message locked under ``token``: the token's 16 bytes, the
    header, the ``x-opt-lock-token`` delivery annotation, then the message's other sections.

    The tests' fake host (tests/support/fake_host.py) builds its messages through this too.
    """
    encoded = bytearray()
    # As the extension's bytes: the .NET message's header, whose delivery count is the wire's + 1 (AmqpMessageConverter:
    # 1 on a first delivery, where the broker sends 0).
    header = amqp.header or Header()
    header = header._replace(delivery_count=(header.delivery_count or 0) + 1)
    encode_payload(encoded, amqp._replace(header=header, delivery_annotations=None, message_annotations=None,
                                          properties=None, application_properties=None, data=None, sequence=None,
                                          value=None, footer=None))
    marker: dict[str | bytes, Any] = {b"x-opt-lock-token": {TYPE: AMQPTypes.uuid, VALUE: token}}
    encode_value(encoded, {TYPE: AMQPTypes.described, VALUE: ({TYPE: AMQPTypes.ulong, VALUE: 0x71},
                                                                encode_annotations(marker))})
    annotations = {k: _typed(v, timestamp=k in _TIMESTAMPS) for k, v in (amqp.message_annotations or {}).items()}
    properties = {k: _typed(v) for k, v in (amqp.application_properties or {}).items()}
    encode_payload(encoded, amqp._replace(header=None, delivery_annotations=None,
                                          message_annotations=annotations or None,
                                          application_properties=properties or None))
    return protos.ModelBindingData(version="1.0", source="AzureServiceBusReceivedMessage",
                                   content_type="application/octet-stream", content=token.bytes_le + bytes(encoded))


_TIMESTAMPS = {b"x-opt-enqueued-time", b"x-opt-locked-until", b"x-opt-scheduled-enqueue-time"}


def _typed(value: Any, *, timestamp: bool = False) -> Any:
    """A decoded value with its AMQP type again where inference would get it wrong (ints are 64-bit)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {TYPE: AMQPTypes.timestamp if timestamp else AMQPTypes.long, VALUE: value}
    return value


def trigger_metadata(message: ServiceBusReceivedMessage) -> dict[str, Any]:
    """What the host adds beside the binding data; every value as JSON, as the host sends numbers and dates."""
    values = {"MessageId": message.message_id, "SessionId": message.session_id,
              "CorrelationId": message.correlation_id, "DeliveryCount": (message.delivery_count or 0) + 1,
              "SequenceNumber": message.sequence_number, "LockToken": str(message.lock_token),
              "EnqueuedTimeUtc": message.enqueued_time_utc.isoformat() if message.enqueued_time_utc else None}
    return {k: protos.TypedData(json=_json(v)) for k, v in values.items() if v is not None}


def _json(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


# (function, delivery, response or None when the worker died or timed out) -> the settlement the host made
Invoker = Callable[[Function, dict[str, Any], dict[str, Any]], Any]


class _Turns:
    """Slots taking turns: at most ``open`` of them at once, from ``least`` up to ``most``."""

    def __init__(self, least: int, most: int) -> None:
        self._least, self._most = min(least, most), most
        self._open = self._least
        self._taken = 0
        self._changed = threading.Condition()

    def take(self, stopping: threading.Event) -> bool:
        """Wait for a turn; False once ``stopping`` is set."""
        with self._changed:
            while self._taken >= self._open and not stopping.is_set():
                self._changed.wait(TURN_CHECK_SECONDS)
            if stopping.is_set():
                return False
            self._taken += 1
            return True

    def wake(self) -> None:
        """Have every slot waiting for a turn look at the stop now."""
        with self._changed:
            self._changed.notify_all()


class AcceptTurns(_Turns):
    """How many of a session trigger's slots may ask for a session at once: ``least`` while sessions come one by one;
    all (``most``) after an accept that found a session waiting; one fewer after each accept that did not."""

    @property
    def open(self) -> int:
        with self._changed:
            return self._open

    def give_back(self, *, quick: bool) -> None:
        """End a turn: ``quick`` when its accept found a session waiting."""
        with self._changed:
            self._taken -= 1
            self._open = self._most if quick else max(self._least, self._open - 1)
            self._changed.notify_all()


class ReceiveTurns(_Turns):
    """How many of a queue trigger's slots hold a receiver at once: ``least`` while messages come one by one; all
    (``most``) after a receive call that returned a message; one fewer after each call that returned none, whose slot
    then lets its receiver go if more slots hold one than that."""

    @property
    def holding(self) -> int:
        with self._changed:
            return self._taken

    def received(self) -> None:
        """A receive call returned a message: every slot may hold a receiver."""
        with self._changed:
            if self._open < self._most:
                self._open = self._most
                self._changed.notify_all()

    def keep_after_none(self) -> bool:
        """A receive call returned none: one turn fewer; False (the turn given back) when the slot is to let its
        receiver go."""
        with self._changed:
            self._open = max(self._least, self._open - 1)
            if self._taken <= self._open:
                return True
            self._taken -= 1
            self._changed.notify_all()
            return False

    def give_back(self) -> None:
        """End a turn another way (the stop, a failure)."""
        with self._changed:
            self._taken -= 1
            self._changed.notify_all()


class ServiceBusListener:
    """Receives for one Service Bus trigger and invokes its function per message."""

    def __init__(self, function: Function, client: ServiceBusClient, options: ServiceBusOptions,
                 deliveries: Deliveries, invoke: Invoker, *, release_rate: float = 0.0) -> None:
        self.function = function
        self._client = client
        self._options = options
        self._deliveries = deliveries
        self._invoke = invoke
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        # slots opening their receiver: on a session queue, waiting on the accept of a session for the try timeout
        self._asking: set[threading.Thread] = set()
        self._asking_lock = threading.Lock()
        trigger = function.trigger
        self.entity = str(trigger.get("queueName") or f"{trigger['topicName']}/{trigger['subscriptionName']}")
        self._sessions = bool(trigger.get("isSessionsEnabled"))
        self._auto_complete = bool(trigger.get("autoCompleteMessages", options.auto_complete_messages))
        self._slots = options.max_concurrent_sessions if self._sessions else options.max_concurrent_calls
        # Closing a receiver takes about half a second (the SDK joins its keep-alive thread); a slot hands
        # that to these threads and takes its next session at once.
        self._closer = ThreadPoolExecutor(max_workers=self._slots, thread_name_prefix=f"{function.name}-close")
        self._release_rate = release_rate if self._sessions else 0.0
        self._released: set[int] = set()  # receivers let go mid-invocation: their slot takes a new session
        self._close_lock = threading.Lock()
        self._rng = random.Random()
        self._accept_turns = AcceptTurns(ACCEPTS_AT_ONCE, self._slots)
        self._receive_turns = ReceiveTurns(RECEIVERS_AT_ONCE, self._slots)

    def start(self) -> None:
        """Start the concurrency slots."""
        for n in range(self._slots):
            thread = threading.Thread(target=self._slot, name=f"{self.function.name}-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop receiving; the messages being handled finish first. A session slot still waiting on its accept, or for
        its turn to ask, holds nothing and is not waited for: a session it is then given it lets go without receiving,
        and the host's process ends its wait when it exits."""
        with self._asking_lock:
            self._stopping.set()
            waiting = [thread for thread in self._threads if thread not in self._asking]
        self._receive_turns.wake()  # a queue slot waiting for its turn holds nothing, and ends at once
        for thread in waiting:
            thread.join()
        self._closer.shutdown(wait=True)

    def _receiver(self) -> Any:
        trigger = self.function.trigger
        # For a session queue the receiver's max_wait_time is how long opening it waits for a session: the TryTimeout,
        # as the host's session processor waits, asking again when none came. A stop does not wait for a slot still
        # asking, which holds nothing (``stop``). Asking in slices of a few seconds instead made each idle slot open a
        # connection that often: most of an idle host's CPU and the broker's, which starved the stack runs on 2 cores.
        options: dict[str, Any] = {"prefetch_count": self._options.prefetch_count,
                                   "max_wait_time": self._options.try_timeout_seconds if self._sessions else None}
        if self._sessions:
            options["session_id"] = NEXT_AVAILABLE_SESSION
        if trigger.get("queueName"):
            return self._client.get_queue_receiver(str(trigger["queueName"]), **options)
        return self._client.get_subscription_receiver(str(trigger["topicName"]), str(trigger["subscriptionName"]),
                                                      **options)

    def _slot(self) -> None:
        me = threading.current_thread()
        while not self._stopping.is_set():
            began = time.monotonic()
            receiver = self._receiver()
            with self._asking_lock:
                if self._stopping.is_set():
                    break
                self._asking.add(me)
            try:
                if not self._open(receiver):
                    break  # the stop came while the slot waited for its turn to ask
            except ServiceBusError as exc:
                self._close_later(receiver)
                if not isinstance(exc, OperationTimeoutError):  # that one only says no session had messages
                    self._failed(exc)
                continue
            finally:
                with self._asking_lock:
                    self._asking.discard(me)
            accepted = time.monotonic()
            renewal = self._session_renewal(receiver) if self._sessions else None
            turn_given_back = False
            try:
                handled, idle, turn_given_back = self._drain(receiver)
            except ServiceBusError as exc:
                self._failed(exc)
                continue
            finally:
                if renewal is not None:
                    renewal.stop()
                if not self._sessions and not turn_given_back:
                    self._receive_turns.give_back()
                self._close_later(receiver)
            if self._sessions:
                logger.info("%s session %s released after %d messages, %.2f s idle, %.2f s held, accepted in %.2f s",
                            self.function.name, receiver.session.session_id, handled, idle,
                            time.monotonic() - accepted, accepted - began)

    def _open(self, receiver: Any) -> bool:
        """Open the slot's receiver once it is this slot's turn to hold one (ReceiveTurns); on a session queue, the
        accept of the next session with messages, once it is this slot's turn to ask (AcceptTurns). False when the
        listener stopped first."""
        if not self._sessions:
            if not self._receive_turns.take(self._stopping):
                return False
            try:
                receiver.__enter__()
            except BaseException:
                self._receive_turns.give_back()
                raise
            return True
        if not self._accept_turns.take(self._stopping):
            return False
        began, quick = time.monotonic(), False
        try:
            receiver.__enter__()
            quick = time.monotonic() - began < QUICK_ACCEPT_SECONDS
            return True
        finally:
            self._accept_turns.give_back(quick=quick)

    def _session_renewal(self, receiver: Any) -> LockRenewal:
        """Renew the session lock from its acceptance, for maxAutoLockRenewalDuration counted once from then."""
        session = receiver.session
        return LockRenewal(f"{self.function.name} session {session.session_id}", session.renew_lock,
                           lambda: session.locked_until_utc, self._options.max_auto_lock_renewal_seconds).start()

    def _message_renewal(self, receiver: Any, message: ServiceBusReceivedMessage) -> LockRenewal | None:
        """Renew a message's lock from now, just before its function runs; a session message has the session's."""
        if self._sessions:
            return None
        return LockRenewal(f"{self.function.name} messageId={message.message_id}",
                           lambda: receiver.renew_message_lock(message), lambda: message.locked_until_utc,
                           self._options.max_auto_lock_renewal_seconds).start()

    def _failed(self, exc: ServiceBusError) -> None:
        logger.warning("%s: receiving from %s failed (%s: %s); retrying", self.function.name, self.entity,
                       type(exc).__name__, str(exc)[:300])
        self._stopping.wait(1.0)

    def _drain(self, receiver: Any) -> tuple[int, float, bool]:
        """Hand over messages until the stop, for a session until none came for the idle timeout, and for a queue
        until the slot's receive turn closed; the messages handled, how long the slot then waited for one more, and
        whether its receive turn was given back."""
        handled, idle_since = 0, time.monotonic()
        while not self._stopping.is_set():
            wait = RECEIVE_WAIT_SECONDS
            if self._sessions:
                left = self._options.session_idle_seconds - (time.monotonic() - idle_since)
                if left <= 0:
                    break  # let the session go, so another can be taken
                wait = min(left, RECEIVE_WAIT_SECONDS)
            batch = receiver.receive_messages(max_message_count=1, max_wait_time=wait)
            if not self._sessions:
                if batch:
                    self._receive_turns.received()
                elif not self._receive_turns.keep_after_none():
                    # more slots hold a receiver than messages need: this one lets its go
                    return handled, time.monotonic() - idle_since, True
            if batch:
                self._handle(receiver, batch[0])
                handled, idle_since = handled + 1, time.monotonic()
                if id(receiver) in self._released:
                    self._released.discard(id(receiver))
                    break
                if getattr(receiver, RELEASE_REQUESTED, False):
                    break  # the function released the session (ReleaseSession): no new receive for it
        return handled, time.monotonic() - idle_since, False

    def _handle(self, receiver: Any, message: ServiceBusReceivedMessage) -> None:
        # As the host's processor: the lock is renewed from just before the function runs until the function and
        # the host's own settlement are over; a message left unsettled then keeps only its LockDuration.
        renewal = self._message_renewal(receiver, message)
        try:
            self._invoke_and_settle(receiver, message)
        finally:
            if renewal is not None:
                renewal.stop()

    def _invoke_and_settle(self, receiver: Any, message: ServiceBusReceivedMessage) -> None:
        delivery = Delivery(receiver, message)
        token = self._deliveries.register(delivery)
        started = time.perf_counter()
        running, timer = threading.Event(), None
        if self._release_rate and self._rng.random() < self._release_rate:
            timer = threading.Timer(self._rng.uniform(0.0, 0.1), self._let_go, (receiver, message, running))
            timer.daemon = True
        running.set()
        if timer is not None:
            timer.start()
        try:
            response = self._invoke(self.function, {self.function.parameter: protos.TypedData(
                model_binding_data=model_binding_data(message))}, trigger_metadata(message))
        finally:
            with self._close_lock:  # the fault lets go only while the function runs
                running.clear()
            if timer is not None:
                timer.cancel()
            self._deliveries.unregister(token)
        succeeded = response is not None and response.result.status == protos.StatusResult.Success
        settlement = self._host_settlement(delivery, succeeded)
        logger.info("%s messageId=%s outcome=%s settlement=%s %.0f ms", self.function.name, message.message_id,
                    "Succeeded" if succeeded else "Failed", settlement, (time.perf_counter() - started) * 1000)

    def _let_go(self, receiver: Any, message: ServiceBusReceivedMessage, running: threading.Event) -> None:
        """Close the session's receiver under a running invocation: the broker ends the session lock, and the
        message comes back for another receiver while the function runs on. Not once the function returned."""
        with self._close_lock:
            if not running.is_set():
                return
            self._released.add(id(receiver))  # the slot takes a new session after this message
        logger.info("%s messageId=%s: %s", self.function.name, message.message_id, RELEASED_MID_INVOCATION)
        self._close(receiver)

    def _close_later(self, receiver: Any) -> None:
        """Close a receiver on the closer's threads, or here once the stop has shut them down."""
        try:
            self._closer.submit(self._close, receiver)
        except RuntimeError:  # a slot that was still asking when the listener stopped
            self._close(receiver)

    def _close(self, receiver: Any) -> None:
        """Close a receiver once, whichever of the slot and the fault comes first."""
        with self._close_lock:
            if getattr(receiver, "_closed_by_host", False):
                return
            receiver._closed_by_host = True
        try:
            receiver.close()
        except Exception as exc:  # a close must not take the slot or the closer down
            logger.warning("%s: closing the receiver failed (%s)", self.function.name, type(exc).__name__)

    def _host_settlement(self, delivery: Delivery, succeeded: bool) -> str:
        if delivery.settled is not None:
            return delivery.settled
        action = "complete" if succeeded and self._auto_complete else "abandon" if not succeeded else ""
        if not action:
            logger.warning("%s returned without settling messageId=%s; with autoCompleteMessages false its lock"
                           " expires and it is redelivered", self.function.name, delivery.message.message_id)
            return "none"
        try:
            delivery.settle(action)
        except (ServiceBusError, ValueError) as exc:
            logger.warning("%s: the host's %s of messageId=%s failed (%s)", self.function.name, action,
                           delivery.message.message_id, type(exc).__name__)
            return f"{action} failed"
        return f"{action} (host)"
