"""Create the Cosmos DB database and containers the consumer uses, if they don't exist yet.

Works against the local server (``python -m devservers.cosmos``) and the real Cosmos DB emulator::

    python -m devservers.cosmos_setup --endpoint http://127.0.0.1:8081
    python -m devservers.cosmos_setup --endpoint https://localhost:8081 --no-verify-tls

It creates, with the real ``azure-cosmos`` SDK:

* the database (``--database``, default ``sales``);
* the orders container (``--container``, default ``orders``): partition key ``/orderId`` (``--partition-key``, for a
  library consumer's container), TTL on
  without a default (``default_ttl=-1``, so items expire only if they carry their own ``ttl``), and
  the indexing policy Bicep deploys, read from the same file (``infra/orders-indexing-policy.json``);
* the leases container (``--leases-container``, default ``leases``): partition key ``/id``.

Running it again changes nothing. An existing container is never modified: if its partition key or
default TTL differs from the above, the script says so and exits with status 1 (a partition key
cannot be changed; recreate the container). An indexing policy that differs only gets a note: the
local server stores the policy without using it, and the Linux emulator does not implement custom
policies, so neither can show what the policy costs or saves. The key defaults to the emulator's
well-known key.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from azure.core.exceptions import AzureError
from azure.cosmos import CosmosClient, DatabaseProxy, PartitionKey

from devservers.cosmos import EMULATOR_KEY
from sbctl.failures import cosmos_failure

# The orders container's indexing policy, the one file cosmos.bicep loads too (loadJsonContent).
ORDERS_INDEXING_POLICY = Path(__file__).resolve().parents[2] / "infra" / "orders-indexing-policy.json"


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    partition_key_path: str
    default_ttl: int | None
    indexing_policy: dict[str, Any] | None = None  # None: the server's default (every path indexed)


def orders_indexing_policy() -> dict[str, Any]:
    """The orders container's indexing policy, as Bicep deploys it."""
    policy: dict[str, Any] = json.loads(ORDERS_INDEXING_POLICY.read_text())
    return policy


def container_specs(container: str = "orders", leases_container: str = "leases",
                    partition_key: str = "/orderId") -> list[ContainerSpec]:
    return [
        ContainerSpec(container, partition_key, default_ttl=-1, indexing_policy=orders_indexing_policy()),
        ContainerSpec(leases_container, "/id", default_ttl=None),
    ]


def make_client(endpoint: str, key: str = EMULATOR_KEY, *, verify_tls: bool = True) -> CosmosClient:
    """A client for ``endpoint``; plain-HTTP endpoints (the local server, the vNext emulator) need
    endpoint discovery off, since the account they advertise is not the address to use."""
    options: dict[str, Any] = {"connection_verify": verify_tls}
    if endpoint.lower().startswith("http://"):
        options["enable_endpoint_discovery"] = False
    return CosmosClient(endpoint, credential=key, **options)


def ensure_containers(client: CosmosClient, database: str, specs: list[ContainerSpec]) -> list[str]:
    """Create the database and containers that are missing; return the problems found in existing ones."""
    db: DatabaseProxy = client.create_database_if_not_exists(id=database)
    problems: list[str] = []
    for spec in specs:
        options: dict[str, Any] = {}
        if spec.default_ttl is not None:
            options["default_ttl"] = spec.default_ttl
        if spec.indexing_policy is not None:
            options["indexing_policy"] = spec.indexing_policy
        container = db.create_container_if_not_exists(
            id=spec.name, partition_key=PartitionKey(path=spec.partition_key_path), **options
        )
        properties = container.read()
        paths = properties.get("partitionKey", {}).get("paths", [])
        if paths != [spec.partition_key_path]:
            problems.append(f"{database}/{spec.name}: partition key is {paths}, expected [{spec.partition_key_path!r}]")
        if properties.get("defaultTtl") != spec.default_ttl:
            problems.append(
                f"{database}/{spec.name}: default TTL is {properties.get('defaultTtl')}, expected {spec.default_ttl}"
            )
    return problems


def indexing_notes(client: CosmosClient, database: str, specs: list[ContainerSpec]) -> list[str]:
    """A note for each container whose indexed paths differ from its spec's policy (an older container,
    or a server that keeps its own); not a failure: a policy can be changed in place, unlike a key."""
    notes = []
    for spec in specs:
        if spec.indexing_policy is None:
            continue
        kept = client.get_database_client(database).get_container_client(spec.name).read().get("indexingPolicy", {})
        if _paths(kept) != _paths(spec.indexing_policy):
            included, excluded = _paths(kept)
            notes.append(f"{database}/{spec.name} keeps another indexing policy than {ORDERS_INDEXING_POLICY.name}"
                         f" (included: {', '.join(included) or 'none listed'}; excluded:"
                         f" {', '.join(excluded) or 'none listed'}); Azure gets the file's, which Bicep loads")
    return notes


def _paths(policy: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Included and excluded paths, sorted: what decides which writes are indexed."""
    return (sorted(p["path"] for p in policy.get("includedPaths", [])),
            sorted(p["path"] for p in policy.get("excludedPaths", [])))


def main(argv: list[str] | None = None) -> int:
    """Create what is missing; 0 ready, 1 failed (one line on stderr says why), 2 bad usage."""
    parser = argparse.ArgumentParser(
        prog="python -m devservers.cosmos_setup",
        description="Create the Cosmos DB database and containers the consumer uses, if they don't exist.",
        epilog="examples:\n"
               "  python -m devservers.cosmos_setup --endpoint http://127.0.0.1:8081   # the local server\n"
               "  python -m devservers.cosmos_setup --endpoint https://localhost:8081 --no-verify-tls  # the emulator\n"
               "\nexit status: 0 ready; 1 failed (one line on stderr says why); 2 bad usage",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--endpoint", required=True, type=_endpoint,
                        help="account endpoint: http://127.0.0.1:8081 for the local server, https://... otherwise")
    parser.add_argument("--key", default=EMULATOR_KEY, help="account key (default: the emulator's well-known key)")
    parser.add_argument("--no-verify-tls", action="store_true", help="accept a self-signed certificate (emulator)")
    parser.add_argument("--database", default="sales", help="database name (default: sales)")
    parser.add_argument("--container", default="orders", help="orders container (partition key /orderId)")
    parser.add_argument("--leases-container", default="leases", help="leases container (partition key /id)")
    parser.add_argument("--partition-key", default="/orderId",
                        help="the container's partition key path (default: /orderId; a library consumer's own, as"
                             " /accountId)")
    args = parser.parse_args(argv)

    specs = container_specs(args.container, args.leases_container, args.partition_key)
    try:
        with _quiet_sdk():
            client = make_client(args.endpoint, args.key, verify_tls=not args.no_verify_tls)
            problems = ensure_containers(client, args.database, specs)
            notes = [] if problems else indexing_notes(client, args.database, specs)
    except (AzureError, ValueError) as exc:  # ValueError: an endpoint or key the SDK cannot use
        print(f"error: {cosmos_failure(args.endpoint, exc, key_option='--key')}", file=sys.stderr)
        return 1
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return 1
    names = ", ".join(spec.name for spec in specs)
    print(f"database {args.database!r} ready with containers {names} at {args.endpoint}")
    for note in notes:
        print(f"note: {note}")
    return 0


def _endpoint(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL, e.g. http://127.0.0.1:8081")
    return text


@contextmanager
def _quiet_sdk() -> Iterator[None]:
    """No SDK log records or warnings (region health, unverified TLS) on stderr: one error line says it all."""
    logger = logging.getLogger("azure")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


if __name__ == "__main__":
    sys.exit(main())
