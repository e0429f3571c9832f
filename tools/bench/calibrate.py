"""``python -m bench.calibrate``: the charges the cost model does not publish, measured on a real account and
printed beside the model's (``bench.index_terms``).

The model prices a write by its size and its index terms; Microsoft publishes neither what a refused write
costs nor a patch's base charge other than by one example. Given an account, this writes a few documents in a
partition of their own, reads each answer's ``x-ms-request-charge``, removes what it wrote, and prints a
table: each operation, its index terms under the container's own indexing policy, the model's RU and the RU
charged.

- creates with 5, 9 and 23 indexed terms (under the default policy; under an opt-in policy the container's
  own count is shown);
- a replace changing one indexed term, a patch of one property and a patch of two (their difference from the
  replace is the patch's base charge);
- a point read, a delete, and a transactional batch refused whole (a create whose id is taken: 409).

    python -m bench.calibrate --endpoint https://ACCOUNT.documents.azure.com:443/ --database orders-db \\
        --container orders                         # DefaultAzureCredential: needs a data-plane role
    python -m bench.calibrate --endpoint http://127.0.0.1:8081 --key KEY     # a temporary container

Without ``--container`` it creates a temporary container with Cosmos DB's default indexing policy and deletes
it after, which needs a key (Microsoft Entra ID tokens cannot create containers on the data plane); with a key,
``--database`` is created if it is missing, and kept (an account's databases are its owner's to remove). The local
Cosmos server charges a flat 1 RU a request: run against it, the measured column says nothing about Azure.
"""

from __future__ import annotations

import argparse
import functools
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from azure.core.exceptions import AzureError
from azure.cosmos import ContainerProxy, CosmosClient, PartitionKey
from azure.cosmos.exceptions import CosmosBatchOperationError, CosmosHttpResponseError

from bench.index_terms import (
    CREATE_PER_TERM,
    DEFAULT_POLICY,
    DELETE_PER_TERM,
    PATCH_BASE_PER_PROPERTY,
    REPLACE_PER_TERM,
    Policy,
    changed_terms,
    read_price,
    size,
    terms,
    write_base,
)

CHARGE = "x-ms-request-charge"
PARTITION = "/orderId"


@dataclass(frozen=True)
class Row:
    """One operation: its index terms, the model's RU (None where nothing is published) and the RU charged."""

    operation: str
    terms: int | None
    model: float | None
    measured: float


def _document(key: str, doc_id: str, leaves: int) -> dict[str, Any]:
    """A document with ``leaves`` leaf values besides ``id`` and ``_ts`` (its partition key among them)."""
    document: dict[str, Any] = {"id": doc_id, "orderId": key}
    document.update({f"f{n}": f"value-{n}" for n in range(leaves - 1)})
    return document


class Calibration:
    """The operations, each on a container and its indexing policy, with the charge of each answer."""

    def __init__(self, container: ContainerProxy) -> None:
        self.container = container
        policy = container.read().get("indexingPolicy") or {}
        # A server that implements no indexing policy (the local one) indexes as the default policy does.
        self.policy = Policy.of({"includedPaths": policy.get("includedPaths") or DEFAULT_POLICY["includedPaths"],
                                 "excludedPaths": policy.get("excludedPaths") or DEFAULT_POLICY["excludedPaths"]})
        self.key = f"calibrate-{uuid.uuid4()}"
        self.rows: list[Row] = []

    def _charged(self, call: Callable[[], Any]) -> tuple[Any, float]:
        """What ``call`` answered, and the charge its answer carried."""
        answer = call()
        return answer, float(self.container.client_connection.last_response_headers.get(CHARGE, "nan"))

    def run(self) -> list[Row]:
        """Every operation, then the documents written removed (their deletes are measured too)."""
        stored: dict[str, dict[str, Any]] = {}
        for leaves in (3, 7, 21):  # + id and _ts: 5, 9 and 23 terms under the default policy
            document = _document(self.key, f"create-{leaves}", leaves)
            written, charge = self._charged(functools.partial(self.container.create_item, document))
            stored[document["id"]] = written
            count = len(terms(written, self.policy))
            self.rows.append(Row(f"create, {leaves + 2} terms by default", count,
                                 write_base(size(written)) + CREATE_PER_TERM * count, charge))
        base = stored["create-7"]
        written, charge = self._charged(functools.partial(self.container.replace_item, base["id"],
                                                          {**base, "f0": "changed"}))
        count = changed_terms(base, written, self.policy)
        self.rows.append(Row("replace, one property changed", count,
                             2 * write_base(size(written)) + REPLACE_PER_TERM * count, charge))
        for properties in (1, 2):
            before = written
            operations = [{"op": "set", "path": f"/f{n}", "value": f"patched-{properties}"} for n in range(properties)]
            written, charge = self._charged(functools.partial(self.container.patch_item, before["id"], self.key,
                                                              operations))
            count = changed_terms(before, written, self.policy)
            self.rows.append(Row(f"patch, {properties} propert{'y' if properties == 1 else 'ies'}", count,
                                 2 * write_base(size(before)) + REPLACE_PER_TERM * count
                                 + PATCH_BASE_PER_PROPERTY * properties, charge))
        stored["create-7"] = written
        _, charge = self._charged(functools.partial(self.container.read_item, written["id"], self.key))
        self.rows.append(Row("point read", None, read_price(size(written)), charge))
        self.rows.append(Row("batch refused whole (409)", None, None, self._refused(stored["create-3"])))
        for doc_id, document in stored.items():
            count = len(terms(document, self.policy))
            _, charge = self._charged(functools.partial(self.container.delete_item, doc_id, self.key))
            self.rows.append(Row(f"delete, {doc_id}", count, write_base(size(document)) + DELETE_PER_TERM * count,
                                 charge))
        return self.rows

    def _refused(self, taken: Mapping[str, Any]) -> float:
        """A batch of a create whose id is taken and one more: refused whole, nothing written."""
        fresh = _document(self.key, "never-written", 3)
        try:
            self.container.execute_item_batch([("create", (dict(taken),)), ("create", (fresh,))],
                                              partition_key=self.key)
        except CosmosBatchOperationError:
            pass
        else:
            raise RuntimeError("the batch of a taken id was not refused")
        return float(self.container.client_connection.last_response_headers.get(CHARGE, "nan"))


def markdown(rows: Sequence[Row], where: str) -> str:
    """The table: each operation, its terms, the model's RU and the RU charged."""
    lines = [f"Charges at {where}", "", "| operation | terms | model RU | charged RU |", "| --- | --- | --- | --- |"]
    for row in rows:
        model = "not published" if row.model is None else f"{row.model:.2f}"
        lines.append(f"| {row.operation} | {'-' if row.terms is None else row.terms} | {model} | {row.measured:.2f} |")
    if all(row.measured == 1.0 for row in rows):
        lines += ["", "Every request was charged 1 RU: a local server's flat charge, not a calibration."]
    return "\n".join(lines)


def _client(args: argparse.Namespace) -> CosmosClient:
    options: dict[str, Any] = {}
    if args.endpoint.startswith("http://"):  # a local server over plain HTTP has one region and no TLS endpoint
        options["enable_endpoint_discovery"] = False
    if args.key:
        return CosmosClient(args.endpoint, credential=args.key, **options)
    from azure.identity import DefaultAzureCredential  # noqa: PLC0415 - only without a key

    return CosmosClient(args.endpoint, credential=DefaultAzureCredential(), **options)


def run(args: argparse.Namespace) -> str:
    """Measure on the account ``args`` name and return the table."""
    client = _client(args)
    database = client.create_database_if_not_exists(args.database) if args.key else client.get_database_client(
        args.database)
    if args.container:
        return markdown(Calibration(database.get_container_client(args.container)).run(),
                        f"{args.endpoint}, container {args.container}")
    name = f"calibrate-{uuid.uuid4().hex[:8]}"
    container = database.create_container(name, partition_key=PartitionKey(path=PARTITION))
    try:
        return markdown(Calibration(container).run(), f"{args.endpoint}, a temporary container (default policy)")
    finally:
        database.delete_container(name)


def main(argv: list[str] | None = None) -> int:
    """Print the table; a failure is one line naming what failed and the likely cause (exit 1), bad usage exit 2."""
    parser = argparse.ArgumentParser(prog="python -m bench.calibrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", required=True, help="the account's endpoint (or a local server's)")
    parser.add_argument("--key", help="an account key (a local emulator's); without it, DefaultAzureCredential")
    parser.add_argument("--database", default="calibrate", help="the database (default calibrate)")
    parser.add_argument("--container", help="an existing container to write a partition of its own in; without it,"
                                            " a temporary container with the default policy (needs --key)")
    args = parser.parse_args(argv)
    if not args.container and not args.key:
        parser.error("without --key, name an existing --container: Entra ID cannot create containers")
    try:
        print(run(args))
    except CosmosHttpResponseError as exc:
        hint = {401: "; check the key", 403: "; check the role assignment",
                404: "; check the database and container names"}.get(exc.status_code or 0, "")
        print(f"calibrate: Cosmos DB at {args.endpoint} answered {exc.status_code}: {exc.reason or exc.message}{hint}",
              file=sys.stderr)
        return 1
    except AzureError as exc:
        print(f"calibrate: cannot reach Cosmos DB at {args.endpoint}: {type(exc).__name__}; check the endpoint"
              " and the network", file=sys.stderr)
        return 1
    except ValueError as exc:  # binascii.Error among them: a key that is not base64
        print(f"calibrate: the key for {args.endpoint} does not read ({exc}); check --key", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
