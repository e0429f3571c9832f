"""Run one delivery: translate, decide, record, settle. Nothing but a failed settlement escapes.

The handler is awaited on the worker's event loop. The binding's settlement calls are blocking gRPC
calls, so they run on threads of their own (not the loop's default pool, which aiohttp's DNS look-ups
share), and the loop keeps serving other deliveries meanwhile. What is logged about a settlement is
logged on the loop, where the worker knows the invocation.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from consumers.binding import to_inbound
from consumers.settlement import SETTLEMENTS, Action, MessageActions, Settlement, settle
from shared.domain.messages import InboundMessage
from shared.domain.outcomes import Outcome, Result, abandon_wait
from shared.telemetry import record_delivery

logger = logging.getLogger("idempotent_consumer.delivery")

Handler = Callable[[InboundMessage], Awaitable[Result]]


Recorder = Callable[[str, InboundMessage, Result, float], None]

# As many as the host runs deliveries at once (host.json: maxConcurrentCalls 16 + maxConcurrentSessions 8),
# so that no settlement waits for a thread.
SETTLEMENT_THREADS = 24
_settling = ThreadPoolExecutor(SETTLEMENT_THREADS, thread_name_prefix="settle")


async def run_delivery(
    function: str, msg: Any, actions: MessageActions, handler: Handler, *, abandon_delay: float = 0.0,
    record: Recorder = record_delivery, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Settlement:
    """Process one PeekLock delivery and settle it exactly once.

    Any exception from translation or the handler becomes outcome ``error`` (abandon, logged with
    its stack, ids only); only a failed settlement call is raised, for the host to log. ``record``
    logs and counts the delivery; if it fails, the delivery is still settled. Before an abandon the
    delivery waits inside its lock (``abandon_wait``), so that retries are spread out in time.
    """
    started = time.perf_counter()
    inbound = InboundMessage(message_id=None, body=None)
    try:
        inbound = to_inbound(msg)
        result = await handler(inbound)
    except asyncio.CancelledError:
        # Only when the worker stops: no settlement now, so the lock runs out and the broker redelivers.
        logger.warning("%s messageId=%s cancelled before its settlement; redelivered once its lock runs out",
                       function, inbound.message_id, extra={"messageId": inbound.message_id, "function": function})
        raise
    except Exception as exc:
        logger.exception(
            "unexpected %s in %s messageId=%s; abandoning for redelivery",
            type(exc).__name__,
            function,
            inbound.message_id,
            extra={"messageId": inbound.message_id, "function": function},
        )
        result = Result(Outcome.ERROR, f"unexpected {type(exc).__name__}")
    try:
        record(function, inbound, result, (time.perf_counter() - started) * 1000)
    except Exception:
        # Telemetry must never cost a settlement: the delivery is still settled below.
        logger.exception("recording delivery %s messageId=%s failed", function, inbound.message_id)
    if SETTLEMENTS[result.outcome].action is Action.ABANDON:
        await sleep(abandon_wait(abandon_delay, inbound.locked_until_utc, time.time()))
    call = functools.partial(settle, msg, actions, result)
    try:
        return await asyncio.get_running_loop().run_in_executor(_settling, call)
    except Exception:
        # Typically a lost lock. The broker will redeliver; the create absorbs it as a duplicate.
        action = SETTLEMENTS[result.outcome].action.value
        logger.error("settlement %s failed messageId=%s outcome=%s", action, inbound.message_id,
                     result.outcome.value, extra={"messageId": inbound.message_id, "outcome": result.outcome.value,
                                                  "settlement": action})
        raise
