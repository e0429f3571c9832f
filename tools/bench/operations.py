"""``python -m bench.operations``: what each path sends Cosmos DB, counted on the wire with the real SDK.

The cost model (``bench.index_terms``) prices operations; this counts them where they leave the app, on the
local Cosmos server (or ``COSMOS_TEST_ENDPOINT``): the same walk through every path, each on a container of
its own, through an HTTP transport that records each request below the SDK's retries. Per path: the requests,
the operations by kind inside each transactional batch and outside, the bytes each way, and the operations
refused by status (409, 412, 404: a batch refused whole counts each of its operations by the status that
failed it). The store's own requests (the container's metadata, the partition-key ranges) are left out.

    python -m bench.operations            # the table
    python -m bench.operations --json     # the figures
    python -m bench.operations --check    # exit 1 unless each path sends what the design promises (PROMISED)

Figures come from the local server: its answers are the same shape as Azure's, but every request is
charged 1 RU, so the request units are ``bench.index_terms``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from azure.core.pipeline.transport import AioHttpTransport
from azure.cosmos import PartitionKey
from azure.cosmos.aio import CosmosClient

from bench.index_terms import Run, walk
from devservers.cosmos import start_cosmos_server
from idempotent_consumer.adapters.cosmos import CosmosStore, make_client
from shared.settings import Settings

BATCH = "x-ms-cosmos-is-batch-request"
QUERY = "x-ms-documentdb-isquery"
REFUSED = (404, 409, 412)
# What each path sends, by the design: the operations of each request, in order ("batch: a, b" for a transactional
# batch, "refused" where it fails whole). The consumer's and the publisher's alike.
PROMISED: dict[str, list[str]] = {
    "new order": ["batch: create, create", "batch: patch, create, patch", "batch: delete"],
    "captured payment": ["create", "batch: create, patch"],
    "shipment": ["create", "batch: create, patch"],
    "copy of a finished order": ["refused batch: create, create", "read"],
    "new order, claim in the order": ["batch: create", "batch: patch, create", "batch: delete"],
    "copy of a finished order, claim in the order": ["refused batch: create", "read"],
    "duplicate event": ["refused create", "read", "refused batch: create, patch", "read"],
}


@dataclass
class Path:
    """What one path sent."""

    requests: list[str] = field(default_factory=list)
    operations: Counter[str] = field(default_factory=Counter)
    refused: Counter[int] = field(default_factory=Counter)
    bytes_out: int = 0
    bytes_in: int = 0


class OperationsTransport(AioHttpTransport):  # type: ignore[misc]  # azure-core is untyped here
    """The SDK's transport, recording each document request of the step ``step`` names."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step = ""
        self.paths: dict[str, Path] = {}

    async def send(self, request: Any, **kwargs: Any) -> Any:
        response = await super().send(request, **kwargs)
        step, target = self.step, urlsplit(request.url).path.rstrip("/")
        if not step or "/docs" not in target:
            return response
        await response.load_body()
        body, answer = _bytes(request), response.body() or b""
        path = self.paths.setdefault(step, Path())
        path.bytes_out += len(body)
        path.bytes_in += len(answer)
        headers = {k.lower(): v for k, v in request.headers.items()}
        if str(headers.get(BATCH, "")).lower() == "true":
            kinds = [str(op["operationType"]).lower() for op in json.loads(body)]
            statuses = [int(r.get("statusCode", 0)) for r in _json_list(answer)]
            failed = next((s for s in statuses if s in REFUSED), None)
            path.operations.update(f"{kind} in a batch" for kind in kinds)
            if failed is not None:
                path.refused[failed] += len(kinds)
            path.requests.append(f"{'refused ' if failed else ''}batch: {', '.join(kinds)}")
            return response
        if str(headers.get(QUERY, "")).lower() == "true":
            kind = "query page"
        else:
            kind = {"GET": "read", "POST": "create", "PUT": "replace", "PATCH": "patch",
                    "DELETE": "delete"}.get(request.method, request.method.lower())
        path.operations[kind] += 1
        if response.status_code in REFUSED:
            path.refused[response.status_code] += 1
            kind = "read (404)" if kind == "read" else f"refused {kind}"
        path.requests.append(kind)
        return response


def _bytes(request: Any) -> bytes:
    data = request.data if request.data is not None else request.body
    if data is None:
        return b""
    return data if isinstance(data, bytes) else str(data).encode()


def _json_list(answer: bytes) -> list[Mapping[str, Any]]:
    try:
        found = json.loads(answer)
    except ValueError:
        return []
    return found if isinstance(found, list) else []


@asynccontextmanager
async def _client(transport: OperationsTransport) -> AsyncIterator[tuple[CosmosClient, Settings]]:
    async with AsyncExitStack() as stack:
        endpoint, key = os.environ.get("COSMOS_TEST_ENDPOINT"), os.environ.get("COSMOS_TEST_KEY")
        if not endpoint:
            server = start_cosmos_server()
            stack.callback(server.stop)
            endpoint, key = server.endpoint, server.key
        settings = Settings(cosmos_endpoint=endpoint, cosmos_key=key, cosmos_database="operations",
                            cosmos_verify_tls=os.environ.get("COSMOS_TEST_VERIFY_TLS", "true") != "false")
        client = await stack.enter_async_context(make_client(settings, transport=transport))
        yield client, settings


async def measure() -> dict[str, Path]:
    """Walk every path on the local server (a container each) and return what each sent."""
    transport = OperationsTransport()
    async with _client(transport) as (client, _):
        database = await client.create_database_if_not_exists("operations")
        made: list[str] = []

        def steps(step: str) -> None:
            transport.step = step

        async def new_run(fulfilment: Any, claim_in_order: bool) -> Run:
            name = f"walk-{uuid.uuid4().hex[:10]}"
            container = await database.create_container(name, partition_key=PartitionKey(path="/orderId"))
            made.append(name)
            return Run(CosmosStore(container), steps, fulfilment, claim_in_order=claim_in_order)

        try:
            await walk(new_run)
        finally:
            for name in made:
                await database.delete_container(name)
    return transport.paths


def broken_promises(paths: Mapping[str, Path]) -> list[str]:
    """Each path of PROMISED that sent anything else, named with what it sent."""
    return [f"{step}: sent {paths[step].requests if step in paths else []}, the design promises {promised}"
            for step, promised in PROMISED.items() if step not in paths or paths[step].requests != promised]


def markdown(paths: Mapping[str, Path]) -> str:
    """One row per path: its requests, operations by kind, refused by status, bytes each way."""
    lines = ["| path | requests | operations | refused | bytes out / in |", "| --- | --- | --- | --- | --- |"]
    for step, path in paths.items():
        operations = ", ".join(f"{n} {kind}" for kind, n in sorted(path.operations.items()))
        refused = ", ".join(f"{n} ({status})" for status, n in sorted(path.refused.items())) or "-"
        lines.append(f"| {step} | {len(path.requests)}: {'; '.join(path.requests)} | {operations} | {refused} |"
                     f" {path.bytes_out:,} / {path.bytes_in:,} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the table (or the figures); with --check, exit 1 where a path breaks the design's promise."""
    parser = argparse.ArgumentParser(prog="python -m bench.operations", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--check", action="store_true", help="exit 1 unless each path sends what PROMISED says")
    args = parser.parse_args(argv)
    paths = asyncio.run(measure())
    if args.json:
        print(json.dumps({step: {"requests": p.requests, "operations": dict(p.operations),
                                 "refused": {str(k): v for k, v in p.refused.items()}, "bytes out": p.bytes_out,
                                 "bytes in": p.bytes_in} for step, p in paths.items()}, indent=2))
    else:
        print(markdown(paths))
    broken = broken_promises(paths) if args.check else []
    for problem in broken:
        print(f"bench.operations: {problem}", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
