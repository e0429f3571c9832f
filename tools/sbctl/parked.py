"""``sbctl parked``: list, release or drop the events the consumer parked while they waited for a predecessor.

Parked events live in the orders container of Cosmos DB, not in a queue, so these commands connect
to Cosmos DB: ``--cosmos-endpoint`` (or $COSMOS_ENDPOINT), with ``--cosmos-key`` (or $COSMOS_KEY) for
local emulators and Entra ID otherwise. Release applies an event whose predecessor will never come;
drop sets one aside for good. Neither deletes anything: a dropped event stays, marked dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from idempotent_consumer.errors import ConfigurationError, NotFound, StoreError, UnreadableDocument
from idempotent_consumer.migrations import set_due
from idempotent_consumer.ordered import operator as operator_commands
from idempotent_consumer.ports.store import DocumentStore
from idempotent_consumer.records import ParkedEvent
from sbctl.connection import ToolError
from sbctl.failures import cosmos_failure
from shared import bootstrap
from shared.domain.aggregate import ORDERS
from shared.settings import Settings


def add_options(parser: argparse.ArgumentParser) -> None:
    """The Cosmos DB connection options every parked command takes."""
    group = parser.add_argument_group("Cosmos DB")
    group.add_argument("--cosmos-endpoint", default=os.environ.get("COSMOS_ENDPOINT"),
                       help="account endpoint URL (default: $COSMOS_ENDPOINT)")
    group.add_argument("--cosmos-key", default=os.environ.get("COSMOS_KEY"),
                       help="account key, for local emulators only (default: $COSMOS_KEY; unset: Entra ID)")
    group.add_argument("--no-verify-tls", action="store_true", help="accept a local emulator's certificate")
    group.add_argument("--database", default=os.environ.get("COSMOS_DATABASE", "sales"), help="database name")
    group.add_argument("--container", default=os.environ.get("COSMOS_CONTAINER", "orders"), help="orders container")
    group.add_argument("--consumer", default=os.environ.get("CONSUMER_NAME", "order-projection"),
                       help="the consumer whose parked events to act on (CONSUMER_NAME)")


@asynccontextmanager
async def _store(args: argparse.Namespace) -> AsyncIterator[DocumentStore]:
    """The orders container's store, as the app builds it (``bootstrap.build``), closed afterwards."""
    if not args.cosmos_endpoint:
        raise ToolError("give --cosmos-endpoint or set COSMOS_ENDPOINT")
    settings = Settings(cosmos_endpoint=args.cosmos_endpoint, cosmos_key=args.cosmos_key,
                        cosmos_verify_tls=not args.no_verify_tls, cosmos_database=args.database,
                        cosmos_container=args.container)
    app = bootstrap.build(settings)
    try:
        yield app.store()
    except ConfigurationError as exc:
        raise ToolError(str(exc)) from None
    except NotFound as exc:
        raise ToolError(str(exc)) from None
    except UnreadableDocument as exc:  # written by a newer version that broke the additive rule, or not ours
        raise ToolError(f"{exc}; if a newer version of the app wrote it, use that version's sbctl") from None
    except (StoreError, ValueError) as exc:  # ValueError: a key that is not base64
        raise ToolError(cosmos_failure(args.cosmos_endpoint, exc, key_option="--cosmos-key")) from None
    finally:
        await app.aclose()


def table(events: list[ParkedEvent], now: float) -> str:
    """One line per parked event: order, version, type, event id, status, age, reason."""
    lines = [f"{'orderId':40} {'version':>7} {'type':32} {'eventId':38} {'status':8} {'age s':>7}  reason"]
    for e in events:
        lines.append(f"{e.partition:40} {e.sequence:>7} {e.event_type.rsplit('.', 1)[-1]:32} {e.event_id:38}"
                     f" {e.status.value:8} {now - e.parked_at:>7.0f}  {e.reason or ''}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Carry out one parked command; 0 done, 3 nothing parked (list)."""
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    async with _store(args) as store:
        if args.command == "index":  # index backfill: due on what the release before wrote
            counts = await set_due(store)
            print(", ".join(f"{name}: {count}" for name, count in sorted(counts.items())) or "no timed records")
            return 0
        if args.parked_command == "list":
            found = await operator_commands.find_parked(store, args.consumer, args.order)
            print(table(found, time.time()))
            return 0 if found else 3
        ttl = Settings.from_env().parked_set_aside_ttl_seconds
        if args.parked_command == "release":
            done = await operator_commands.force_release(store, ORDERS, args.consumer, args.order, args.event,
                                                         set_aside_ttl=ttl)
            versions = [event.sequence for _, event in done.applied]
            print(f"released versions {versions} onto order {args.order}; it is at version {done.subject.version}")
            return 0
        dropped = await operator_commands.drop(store, ORDERS, args.consumer, args.order, args.event,
                                                set_aside_ttl=ttl)
        print(f"dropped version {dropped.sequence} ({dropped.event_id}) of order {args.order}; kept, marked dropped")
        return 0
