"""Cosmos DB triggers: the monitored container's change feed, polled, with its progress in the lease container.

One lease document per trigger holds the feed's continuation, its owner and how long the owner holds
it; it covers partition key range 0, the only one of the local server and the emulator. Of several
host processes, the one holding a live lease reads the feed; an expired lease is taken over (an
etag-conditional replace, so two hosts never both win). After each batch the continuation is saved,
whether the function succeeded or not, as the host's trigger does without a retry policy: a
restarted host resumes after the last batch it handed over, and a failed batch is not retried (the
app's sweep covers what a failed batch left). A trigger without a lease starts from its first poll
("now"), or from the beginning with ``startFromBeginning``.

The timings are the Functions host's, from the trigger's binding or, when unset, its defaults
(CosmosDBv4TriggerOptions, https://learn.microsoft.com/javascript/api/@azure/functions/cosmosdbv4triggeroptions):
``feedPollDelay`` "the delay between polling a partition for new changes on the feed, after all current
changes are drained", 5,000 ms, so a feed with changes left is read again at once; ``leaseExpirationInterval``
60,000 ms, after which a lease not renewed passes to another instance; ``leaseRenewInterval`` 17,000 ms,
on which the holder renews, alongside its invocations; ``leaseAcquireInterval`` 13,000 ms, on which an
instance without the lease looks again; and ``maxItemsPerInvocation``, unset, which leaves the page
size to the service (100 items, the REST API's default ``x-ms-max-item-count``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import AzureError
from azure.cosmos import ContainerProxy, CosmosClient
from azure.cosmos.exceptions import CosmosAccessConditionFailedError, CosmosResourceNotFoundError

from devservers.host.process import Function, HostError, failure
from devservers.host.protos import protos

logger = logging.getLogger("devservers.host")
FEED_POLL_DELAY_MS = 5_000
LEASE_EXPIRATION_MS = 60_000
LEASE_RENEW_MS = 17_000
LEASE_ACQUIRE_MS = 13_000
MAX_BATCH = 100


def cosmos_client(settings: dict[str, str], connection: str) -> CosmosClient:
    """A client for a Cosmos DB connection setting: a connection string, or ``X__accountEndpoint``."""
    if text := settings.get(connection):
        parts = dict(re.findall(r"(\w+)=([^;]+)", text))
        endpoint, key = parts.get("AccountEndpoint"), parts.get("AccountKey")
        if not endpoint or not key:
            raise HostError(f"{connection}: expected AccountEndpoint=...;AccountKey=...;")
        options: dict[str, Any] = {"connection_verify": False} if endpoint.startswith("https://127.") else {}
        if endpoint.startswith("http://"):
            options["enable_endpoint_discovery"] = False  # a local server over plain HTTP has one region
        return CosmosClient(endpoint, credential=key, **options)
    if endpoint := settings.get(f"{connection}__accountEndpoint"):
        from azure.identity import DefaultAzureCredential  # noqa: PLC0415 - only for identity connections

        return CosmosClient(endpoint, credential=DefaultAzureCredential())
    raise HostError(f"set {connection} (a connection string) or {connection}__accountEndpoint")


class ChangeFeedListener:
    """Polls one container's change feed for one function while this host holds the lease."""

    def __init__(self, function: Function, connect: Callable[[], tuple[ContainerProxy, ContainerProxy]],
                 lease_id: str, invoke: Callable[[Function, dict[str, Any], dict[str, Any]], Any]) -> None:
        self.function = function
        self._connect = connect  # the monitored and the lease container, made by the polling thread on its first turn
        self._containers: tuple[ContainerProxy, ContainerProxy] | None = None
        self._lease_id = lease_id
        self._invoke = invoke
        self.owner = f"host-{uuid.uuid4()}"
        trigger = function.trigger
        self._poll_delay = _seconds(trigger.get("feedPollDelay"), FEED_POLL_DELAY_MS)
        self._expiration = _seconds(trigger.get("leaseExpirationInterval"), LEASE_EXPIRATION_MS)
        self._renew_every = _seconds(trigger.get("leaseRenewInterval"), LEASE_RENEW_MS)
        self._acquire_every = _seconds(trigger.get("leaseAcquireInterval"), LEASE_ACQUIRE_MS)
        self._max_items = int(trigger.get("maxItemsPerInvocation") or MAX_BATCH)
        self._held: dict[str, Any] | None = None  # the lease as last written by this host, while it holds it
        self._lease_lock = threading.Lock()  # the renewer and the reader both write the lease
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{function.name}-feed", daemon=True)
        self._renewer = threading.Thread(target=self._renew, name=f"{function.name}-lease", daemon=True)

    @classmethod
    def for_function(cls, function: Function, settings: dict[str, str],
                     invoke: Callable[[Function, dict[str, Any], dict[str, Any]], Any]) -> ChangeFeedListener:
        """The listener for a cosmosDBTrigger's binding: its connection, container and lease container."""
        trigger = function.trigger
        connection = str(trigger.get("connection") or "CosmosDBConnection")
        if not settings.get(connection) and not settings.get(f"{connection}__accountEndpoint"):
            raise HostError(f"set {connection} (a connection string) or {connection}__accountEndpoint")

        def connect() -> tuple[ContainerProxy, ContainerProxy]:
            # Made on the listener's thread, not at start: the client reads the account when it is made, and the
            # Functions host starts, and serves its other triggers, while Cosmos DB is unreachable.
            client = cosmos_client(settings, connection)
            database = client.get_database_client(str(trigger["databaseName"]))
            leases = client.get_database_client(str(trigger.get("leaseDatabaseName") or trigger["databaseName"]))
            return (database.get_container_client(str(trigger["containerName"])),
                    leases.get_container_client(str(trigger.get("leaseContainerName") or "leases")))

        lease_id = f"{trigger.get('leaseContainerPrefix') or ''}{trigger['databaseName']}.{trigger['containerName']}.0"
        return cls(function, connect, lease_id, invoke)

    @property
    def _monitored(self) -> ContainerProxy:
        return self._connected()[0]

    @property
    def _leases(self) -> ContainerProxy:
        return self._connected()[1]

    def _connected(self) -> tuple[ContainerProxy, ContainerProxy]:
        if self._containers is None:
            self._containers = self._connect()
        return self._containers

    def start(self) -> None:
        """Start polling, and renewing the lease while this host holds it."""
        self._thread.start()
        self._renewer.start()

    def stop(self) -> None:
        """Stop polling; a batch being handled finishes first, and the lease is let go."""
        self._stopping.set()
        for thread in (self._thread, self._renewer):
            if thread.ident is not None:  # started
                thread.join()
        with self._lease_lock, contextlib.suppress(AzureError):  # else it expires by itself
            if self._held is not None:
                self._write(self._held, leaseUntil=0)  # another host may take it at once

    def _run(self) -> None:
        wait = 0.0
        while not self._stopping.wait(wait):
            try:
                wait = self._step()
            except Exception as exc:
                logger.warning("%s: change feed of %s failed (%s: %s); retrying", self.function.name,
                               self.function.trigger.get("containerName"), type(exc).__name__, str(exc)[:300])
                wait = self._poll_delay

    def _step(self) -> float:
        """One turn: take the lease if free, read a batch and hand it over; the seconds to wait before the next."""
        with self._lease_lock:
            if self._held is None or float(self._held.get("leaseUntil") or 0) <= time.time():
                self._held = self._acquire()
            lease = self._held
        if lease is None:
            return self._acquire_every
        return 0.0 if self._read_batch(lease) else self._poll_delay

    def _renew(self) -> None:
        while not self._stopping.wait(self._renew_every):
            with self._lease_lock:
                if self._held is None:
                    continue
                try:
                    self._held = self._write(self._held, leaseUntil=time.time() + self._expiration)
                except Exception as exc:  # the thread must go on renewing
                    logger.warning("%s: lease renewal failed (%s); retrying", self.function.name, type(exc).__name__)

    def _acquire(self) -> dict[str, Any] | None:
        """The lease document if this host can take it now (it is new, free, expired or already ours), else None."""
        now = time.time()
        try:
            lease = self._leases.read_item(self._lease_id, partition_key=self._lease_id)
        except CosmosResourceNotFoundError:
            fresh = {"id": self._lease_id, "owner": self.owner, "leaseUntil": now + self._expiration,
                     "continuation": None}
            try:
                return dict(self._leases.create_item(fresh))
            except AzureError:
                return None  # another host created it first
        if lease.get("owner") != self.owner and float(lease.get("leaseUntil") or 0) > now:
            return None
        return self._write(lease, owner=self.owner, leaseUntil=now + self._expiration)

    def _write(self, lease: dict[str, Any], **changes: Any) -> dict[str, Any] | None:
        """The lease with ``changes``, replaced on its etag; None when another host took it meanwhile."""
        body = {k: v for k, v in lease.items() if not k.startswith("_")} | changes
        try:
            return dict(self._leases.replace_item(self._lease_id, body, etag=lease["_etag"],
                                                  match_condition=MatchConditions.IfNotModified))
        except CosmosAccessConditionFailedError:
            return None

    def _checkpoint(self, continuation: str | None) -> None:
        with self._lease_lock:
            if self._held is not None:
                self._held = self._write(self._held, continuation=continuation,
                                         leaseUntil=time.time() + self._expiration)

    def _read_batch(self, lease: dict[str, Any]) -> bool:
        """Read and hand over one batch; whether it held changes (then the feed is read again at once)."""
        # The partition-key-range form of the feed, whose continuation is the bare etag the server
        # answers with: it resumes exactly, and "now" is the etag of the first poll.
        options: dict[str, Any] = {"partition_key_range_id": "0", "max_item_count": self._max_items}
        if lease.get("continuation"):
            options["continuation"] = lease["continuation"]
        else:
            options["is_start_from_beginning"] = bool(self.function.trigger.get("startFromBeginning"))
        # One page, one request: its etag, from its own response (the client's last headers may be the lease
        # renewer's by now), is where the next read starts, so nothing past the page is skipped.
        answered: list[str | None] = []
        pages = self._monitored.query_items_change_feed(
            **options, response_hook=lambda headers, _: answered.append(headers.get("etag"))).by_page()
        page = next(pages, None)
        documents = list(page) if page is not None else []
        continuation = answered[-1] if answered else lease.get("continuation")
        if not documents:
            if continuation != lease.get("continuation"):
                self._checkpoint(continuation)  # the first poll fixes "now"
            return False
        retry, tries = self.function.retry, 0
        while True:
            started = time.perf_counter()
            response = self._invoke(self.function, {self.function.parameter: protos.TypedData(
                json=json.dumps(documents))}, {})
            succeeded = response is not None and response.result.status == protos.StatusResult.Success
            logger.info("%s documents=%d outcome=%s %.0f ms%s", self.function.name, len(documents),
                        "Succeeded" if succeeded else "Failed", (time.perf_counter() - started) * 1000,
                        "" if succeeded else f" error={failure(response)}")
            # The function's retry policy, as the Functions host runs it for this trigger: the batch again, the
            # checkpoint held, until it succeeds or the retries run out; a host stopping meanwhile leaves the
            # checkpoint where it was, for the next holder of the lease to read the batch again.
            if succeeded or retry is None or tries >= retry.max_retry_count:
                break
            tries += 1
            if self._stopping.wait(retry.delay_seconds(tries)):
                return True
            logger.info("%s documents=%d retry %d of %d", self.function.name, len(documents), tries,
                        retry.max_retry_count)
        self._checkpoint(continuation)
        return True


def _seconds(milliseconds: object, default_ms: int) -> float:
    """A binding's interval in milliseconds (a number or its text), as seconds; the default when unset."""
    return (int(str(milliseconds)) if milliseconds not in (None, "") else default_ms) / 1000
