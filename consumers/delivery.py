"""Run one delivery: translate, decide, record, settle. Nothing but a failed settlement escapes.

The handler is awaited on the worker's event loop. The binding's settlement calls are blocking gRPC
calls, so they run on a thread, and the loop keeps serving other deliveries meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from consumers.binding import to_inbound
from consumers.settlement import SETTLEMENTS, Action, MessageActions, Settlement, settle
from shared.domain.messages import InboundMessage
from shared.domain.outcomes import Outcome, Result, abandon_wait
from shared.telemetry import record_delivery

logger = logging.getLogger("idempotent_consumer.delivery")

Handler = Callable[[InboundMessage], Awaitable[Result]]


Recorder = Callable[[str, InboundMessage, Result, float], None]


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
    return await asyncio.to_thread(settle, msg, actions, result, message_id=inbound.message_id)
