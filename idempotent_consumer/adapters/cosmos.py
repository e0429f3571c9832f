"""The Cosmos DB adapter of the DocumentStore port, over ``azure.cosmos.aio``; the only module that imports
azure.cosmos.

The functions are ``async def``: measured in ``make bench``, the async client gives about twice the
sync client's throughput at 32 concurrent deliveries, and 1.4x at one (README "Performance").

Every SDK error is translated in ``translate_errors``; nothing else catches azure exceptions. The
port's conditions and queries are rendered as Cosmos DB SQL here, with values as parameters.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ServiceRequestError, ServiceResponseError
from azure.core.pipeline.transport import AioHttpTransport
from azure.cosmos.aio import ContainerProxy, CosmosClient
from azure.cosmos.exceptions import CosmosBatchOperationError, CosmosClientTimeoutError, CosmosHttpResponseError

from idempotent_consumer.adapters.credentials import TokenFailure, managed_identity, token_failure
from idempotent_consumer.errors import (
    AlreadyExists,
    BatchFailed,
    ConfigurationError,
    NotFound,
    PreconditionFailed,
    StoreError,
    TransientStoreError,
)
from idempotent_consumer.outcomes import is_transient
from idempotent_consumer.ports.store import (
    ABSENT,
    MAX_PAGE_ITEMS,
    BatchOperation,
    Create,
    Delete,
    Document,
    Patch,
    batch_result,
    check_batch,
    check_field,
    check_item,
)

# Retry budget, bounded so that a create plus the read after a 409 end well inside the default
# one-minute lock: each operation gives up after OPERATION_TIMEOUT_SECONDS, and throttling retries
# stop after 3 attempts or 10 s, where the SDK's default would wait 30 s.
CONNECTION_TIMEOUT_SECONDS = 5
READ_TIMEOUT_SECONDS = 10
OPERATION_TIMEOUT_SECONDS = 20
THROTTLE_RETRIES = 3
THROTTLE_MAX_WAIT_SECONDS = 10
CONNECTION_RETRIES = 2


@contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Map azure-cosmos and azure-core errors to the shared error family, chained to the original."""
    try:
        yield
    except CosmosBatchOperationError as exc:
        raise _from_batch(what, exc) from exc
    except CosmosHttpResponseError as exc:
        raise _from_status(what, exc.status_code, getattr(exc, "sub_status", None)) from exc
    except CosmosClientTimeoutError as exc:
        raise TransientStoreError(f"{what}: timed out in the client", status=408) from exc
    except (ServiceRequestError, ServiceResponseError) as exc:
        raise TransientStoreError(f"{what}: connection failed ({type(exc).__name__})") from exc
    except AzureError as exc:
        failure = token_failure(exc)
        if failure is TokenFailure.TRANSIENT:
            raise TransientStoreError(f"{what}: the managed identity's token endpoint failed"
                                      f" ({type(exc).__name__}): an outage") from exc
        if failure is TokenFailure.CONFIGURATION:
            raise ConfigurationError("the app's identity", f"{what}: the token endpoint refused it ({exc}); check the"
                                     " managed identity and its role assignments") from exc
        raise StoreError(f"{what}: {type(exc).__name__}") from exc


_BY_STATUS: dict[int, type[StoreError]] = {409: AlreadyExists, 404: NotFound, 412: PreconditionFailed}


def _from_status(what: str, status: int | None, sub_status: int | None) -> StoreError:
    detail = f"{what}: HTTP {status}" + (f".{sub_status}" if sub_status else "")
    # A 408 on a write leaves the outcome unknown; abandoning is safe: the redelivery's create is the dedup check.
    if is_transient(status):
        return TransientStoreError(detail, status=status)
    return _BY_STATUS.get(status or 0, StoreError)(detail, status=status)


class CosmosSettings(Protocol):
    """What the Cosmos DB adapter reads of a consumer's settings (the app's ``Settings`` has these fields)."""

    @property
    def cosmos_key(self) -> str | None: ...
    @property
    def cosmos_verify_tls(self) -> bool: ...
    @property
    def cosmos_database(self) -> str: ...
    @property
    def cosmos_container(self) -> str: ...
    @property
    def http_proxy_from_environment(self) -> bool: ...

    def need(self, attribute: str) -> Any:
        """The value of a setting the adapter cannot work without (``cosmos_endpoint``); ConfigurationError
        naming it when unset."""


def credential_for(settings: CosmosSettings) -> Any:
    """The account key when one is configured (local emulators only), else the app's identity
    (``credentials.managed_identity``)."""
    if settings.cosmos_key:
        return settings.cosmos_key
    return managed_identity()


def _from_batch(what: str, exc: CosmosBatchOperationError) -> StoreError:
    index = exc.error_index
    response = exc.operation_responses[index] if 0 <= index < len(exc.operation_responses) else {}
    status = response.get("statusCode")
    sub_status = response.get("subStatusCode")
    error = _from_status(f"{what}: operation {index}", status, sub_status)
    if isinstance(error, TransientStoreError):
        # The batch as a whole may succeed later: a throttled or timed-out operation is not a verdict.
        return error
    return BatchFailed(index, error)


def batch_operation(op: BatchOperation) -> tuple[Any, ...]:
    """One operation in the SDK's batch form (``execute_item_batch``)."""
    if isinstance(op, Create):
        return ("create", (op.document,))
    if isinstance(op, Patch):
        options = {"filter_predicate": filter_predicate(op.condition)} if op.condition else {}
        if op.if_match:
            options["if_match_etag"] = op.if_match
        return ("patch", (op.doc_id, patch_operations(op)), options)
    options = {"if_match_etag": op.if_match} if op.if_match else {}
    if isinstance(op, Delete):
        return ("delete", (op.doc_id,), options)
    return ("replace", (op.document["id"], op.document), options)


def patch_operations(op: Patch) -> list[dict[str, Any]]:
    """The patch's fields as Cosmos DB patch operations, one ``set`` each."""
    return [{"op": "set", "path": f"/{name}", "value": value} for name, value in op.set_fields.items()]


def query_text(conditions: Mapping[str, Any], before: tuple[str, Any] | None) -> tuple[str, list[dict[str, Any]]]:
    """Render a store query as Cosmos DB SQL with parameters."""
    clauses, parameters = [], []
    for n, (name, value) in enumerate(conditions.items()):
        check_field(name)
        clauses.append(f"c.{name} = @p{n}")
        parameters.append({"name": f"@p{n}", "value": value})
    if before is not None:
        check_field(before[0])
        clauses.append(f"c.{before[0]} < @before")
        parameters.append({"name": "@before", "value": before[1]})
    where = " WHERE " + " AND ".join(clauses) if clauses else ""
    # Field names are checked against a plain-identifier pattern; values travel as parameters.
    return "SELECT * FROM c" + where, parameters  # noqa: S608


def filter_predicate(condition: Mapping[str, Any]) -> str:
    """Render a Patch condition as a Cosmos DB filter predicate, e.g. ``from c where c.version = 2``."""
    clauses = []
    for path, expected in condition.items():
        name = ".".join(path.split("/"))  # a path into an object field: each name a plain identifier (check_batch)
        if expected is ABSENT:
            clauses.append(f"NOT IS_DEFINED(c.{name})")
        elif isinstance(expected, tuple):
            values = ", ".join(json.dumps(v) for v in expected)
            clauses.append(f"c.{name} IN ({values})")
        else:
            clauses.append(f"c.{name} = {json.dumps(expected)}")
    return "from c where " + " AND ".join(clauses)


logger = logging.getLogger("idempotent_consumer.cosmos")
# What aiohttp reads from the environment per request when HTTP_PROXY_FROM_ENVIRONMENT is true (trust_env).
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")
# What requests read and aiohttp never does: the CA of a TLS-inspecting proxy goes in SSL_CERT_FILE.
CA_BUNDLE_VARIABLES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


def ignored_proxy_variables(settings: CosmosSettings, environ: Mapping[str, str] = os.environ) -> list[str]:
    """The proxy variables set in the environment that the clients ignore (the setting is off), and the
    CA-bundle variables they never read; each kind named in one warning."""
    bundles = [name for name in CA_BUNDLE_VARIABLES if environ.get(name)]
    if bundles:
        logger.warning("%s set, but the Cosmos DB and fulfilment clients (aiohttp) never read it; put the CA in"
                       " SSL_CERT_FILE", ", ".join(bundles))
    if settings.http_proxy_from_environment:
        return bundles
    found = [name for name in PROXY_VARIABLES if environ.get(name)]
    if found:
        logger.warning("%s set, but HTTP_PROXY_FROM_ENVIRONMENT is false: the Cosmos DB and fulfilment clients"
                       " ignore them; set it to true behind a proxy", ", ".join(found))
    return found + bundles


def make_client(settings: CosmosSettings, transport: Any = None, credential: Any = None) -> CosmosClient:
    """Create an async CosmosClient: key auth for local emulators, managed identity otherwise.

    Call it inside the event loop that will use it (the worker's); it connects on its first request.
    ``transport`` replaces the SDK's HTTP transport (the benchmarks count requests with one).
    ``credential`` is ``credential_for(settings)`` made by a caller that closes it (the client does not).
    """
    endpoint: str = settings.need("cosmos_endpoint")
    options: dict[str, Any] = dict(
        connection_verify=settings.cosmos_verify_tls, connection_timeout=CONNECTION_TIMEOUT_SECONDS,
        read_timeout=READ_TIMEOUT_SECONDS, timeout=OPERATION_TIMEOUT_SECONDS, retry_throttle_total=THROTTLE_RETRIES,
        retry_throttle_backoff_max=THROTTLE_MAX_WAIT_SECONDS, retry_total=CONNECTION_RETRIES,
        retry_connect=CONNECTION_RETRIES, retry_read=CONNECTION_RETRIES,
    )
    # Without a proxy, aiohttp's look-up of proxy settings in os.environ on every request is waste.
    ignored_proxy_variables(settings)
    options["transport"] = transport or AioHttpTransport(use_env_settings=settings.http_proxy_from_environment)
    if endpoint.startswith("http://"):
        # Local servers over plain HTTP have one region; discovery would ask for a TLS endpoint.
        options["enable_endpoint_discovery"] = False
    with translate_errors("connect to Cosmos DB"):
        return CosmosClient(endpoint, credential=credential or credential_for(settings), **options)


def _container(client: CosmosClient, settings: CosmosSettings) -> ContainerProxy:
    return client.get_database_client(settings.cosmos_database).get_container_client(settings.cosmos_container)


class CosmosStore:
    """DocumentStore over one Cosmos DB container."""

    def __init__(
        self, container: ContainerProxy, owned: Sequence[Any] = (), unopened: CosmosClient | None = None
    ) -> None:
        self._container = container
        self._owned = list(owned)  # the client and credential this store made, closed by ``close``
        self._unopened = unopened  # a client this store made, opened on its first request
        self._opening = asyncio.Lock()  # binds to the loop of its first use

    @classmethod
    def from_settings(cls, settings: CosmosSettings, client: CosmosClient | None = None) -> CosmosStore:
        """Bind to the configured container; connects on first use, never at construction."""
        if client is not None:
            return cls(_container(client, settings))
        credential = credential_for(settings)
        client = make_client(settings, credential=credential)
        made = [client] if isinstance(credential, str) else [client, credential]
        return cls(_container(client, settings), owned=made, unopened=client)

    async def _ready(self) -> ContainerProxy:
        """The container, once the client this store made is open. Opening (``__aenter__``) reads the
        account: its regions, and its consistency, from which the client keeps session tokens. The sync
        client did that in its constructor; without it the async client sends no session token, and a
        read after our own write could reach a replica that has not seen it."""
        if self._unopened is not None:
            async with self._opening:
                if (client := self._unopened) is not None:
                    with translate_errors("connect to Cosmos DB"):
                        await client.__aenter__()
                    self._unopened = None
        return self._container

    async def close(self) -> None:
        """Close what this store made: the client (its HTTP session), then a managed-identity credential
        (the client leaves it open). A client handed in is its owner's to close."""
        owned, self._owned = self._owned, []
        for resource in owned:
            await resource.close()

    async def create(self, document: Document) -> Document:
        """Create the document; a taken id raises AlreadyExists, a document larger than an item may be
        BatchTooLarge, before anything is sent."""
        check_item(document)
        with translate_errors(f"create {document.get('id')}"):
            return dict(await (await self._ready()).create_item(body=document))

    async def read(self, doc_id: str, partition_key: str) -> Document:
        """Point-read a document; a missing one raises NotFound."""
        with translate_errors(f"read {doc_id}"):
            return dict(await (await self._ready()).read_item(item=doc_id, partition_key=partition_key))

    async def query_pages(
        self, conditions: Mapping[str, Any], *, partition_key: str | None = None,
        before: tuple[str, Any] | None = None, page_size: int = MAX_PAGE_ITEMS,
    ) -> AsyncIterator[list[Document]]:
        """A query with parameters, in one partition or across all, a page (``max_item_count``) at a time; the
        SDK follows each page's continuation token to the next."""
        sql, parameters = query_text(conditions, before)
        # The async client queries across partitions when no partition key is given.
        scope: dict[str, Any] = {"partition_key": partition_key} if partition_key is not None else {}
        container = await self._ready()
        with translate_errors("query"):
            pager = container.query_items(sql, parameters=parameters, max_item_count=page_size, **scope).by_page()
            async for page in pager:
                yield [dict(item) async for item in page]

    async def execute_batch(self, partition_key: str, operations: Sequence[BatchOperation]) -> list[Document]:
        """One transactional batch in one partition: all operations or none. An ``etag_only`` patch alone is
        sent as a point patch without a body in its answer (``_patch_alone``)."""
        check_batch(operations)
        container = await self._ready()
        if len(operations) == 1 and isinstance(op := operations[0], Patch) and op.etag_only:
            return [await self._patch_alone(container, partition_key, op)]
        with translate_errors(f"batch of {len(operations)} in {partition_key}"):
            results = await container.execute_item_batch(
                batch_operations=[batch_operation(op) for op in operations], partition_key=partition_key
            )
        return [batch_result(op, dict(r.get("resourceBody") or {})) for op, r in zip(operations, results, strict=True)]

    async def _patch_alone(self, container: ContainerProxy, partition_key: str, op: Patch) -> Document:
        """The patch as a point operation with ``no_response`` (``Prefer: return=minimal``): one request, as
        the batch of it would be, and the new etag read from the answer's headers, with no document to
        parse. It fails as the batch would: a verdict on the operation (412, 404, 400) is BatchFailed at
        index 0, a transient failure is raised as it is."""
        what = f"patch of {op.doc_id} in {partition_key}"
        try:
            with translate_errors(what):
                answer = await container.patch_item(
                    op.doc_id, partition_key, patch_operations(op),
                    filter_predicate=filter_predicate(op.condition) if op.condition else None,
                    etag=op.if_match, match_condition=MatchConditions.IfNotModified if op.if_match else None,
                    no_response=True)
        except TransientStoreError:
            raise
        except StoreError as exc:
            raise BatchFailed(0, exc) from exc
        etag = answer.get_response_headers().get("etag")
        if not etag:
            raise StoreError(f"{what}: the answer carried no etag")
        return {"id": op.doc_id, "_etag": etag}
