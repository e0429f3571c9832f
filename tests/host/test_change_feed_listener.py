"""The local host's Cosmos DB trigger keeps the Functions host's timings: a backlog is read batch after
batch with no wait, the feed waits feedPollDelay only once drained, a lease lasts leaseExpirationInterval
and an instance without it looks again every leaseAcquireInterval (defaults, or the binding's values).

Each turn of the listener (``_step``) runs here on the test's thread against the local Cosmos server, and
returns the seconds it would wait before the next, so nothing is timed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.cosmos import PartitionKey

from devservers.host.changefeed import ChangeFeedListener
from devservers.host.process import Function, Retry
from devservers.host.protos import protos
from tests.support.cosmos import CosmosEndpoint, make_cosmos_client


class Feed:
    """A monitored container and its lease container, in a database of their own."""

    def __init__(self, endpoint: CosmosEndpoint) -> None:
        self._client = make_cosmos_client(endpoint)
        self.database = self._client.create_database_if_not_exists(f"feed-{uuid.uuid4().hex[:8]}")
        self.monitored = self.database.create_container_if_not_exists("orders", PartitionKey(path="/orderId"))
        self.leases = self.database.create_container_if_not_exists("leases", PartitionKey(path="/id"))
        self.batches: list[int] = []

    def listener(self, monitored: Any = None, **binding: Any) -> ChangeFeedListener:
        trigger = {"type": "cosmosDBTrigger", "name": "documents", "databaseName": self.database.id,
                   "containerName": "orders", **binding}

        def invoke(function: Function, data: dict[str, Any], _: dict[str, Any]) -> None:
            self.batches.append(data["documents"].json.count('"orderId"'))

        function = Function(name="publish_outbox", function_id="id-publish", trigger=trigger)
        return ChangeFeedListener(function, lambda: (monitored or self.monitored, self.leases),
                                  f"{self.database.id}.orders.0", invoke)

    def write(self, count: int) -> None:
        for n in range(count):
            self.monitored.create_item({"id": f"d-{uuid.uuid4()}", "orderId": f"o-{n}"})

    def lease(self) -> dict[str, Any]:
        [lease] = list(self.leases.read_all_items())
        return dict(lease)

    def drop(self) -> None:
        self._client.delete_database(self.database.id)


@pytest.fixture
def feed(cosmos_endpoint: CosmosEndpoint) -> Iterator[Feed]:
    made = Feed(cosmos_endpoint)
    yield made
    made.drop()


def test_a_backlog_is_read_batch_after_batch_and_the_poll_delay_waited_only_once_drained(feed: Feed) -> None:
    listener = feed.listener()
    assert listener._step() == 5.0  # the first poll takes the lease and fixes "now": nothing yet
    feed.write(250)
    waits = [listener._step() for _ in range(4)]
    assert (waits, feed.batches) == ([0.0, 0.0, 0.0, 5.0], [100, 100, 50])


def test_the_bindings_intervals_replace_the_defaults(feed: Feed) -> None:
    listener = feed.listener(feedPollDelay=2000, leaseExpirationInterval=30000, maxItemsPerInvocation=40)
    before = time.time()
    assert listener._step() == 2.0
    assert before + 30 <= float(feed.lease()["leaseUntil"]) <= time.time() + 30
    feed.write(50)
    assert [listener._step() for _ in range(3)] == [0.0, 0.0, 2.0]
    assert feed.batches == [40, 10]


def test_a_lease_lasts_60_seconds_and_another_instance_looks_again_every_13(feed: Feed) -> None:
    holder, other = feed.listener(), feed.listener()
    before = time.time()
    holder._step()
    assert before + 60 <= float(feed.lease()["leaseUntil"]) <= time.time() + 60
    feed.write(3)
    assert other._step() == 13.0
    assert feed.batches == []  # the other instance read nothing while the lease was held
    assert holder._step() == 0.0 and feed.batches == [3]


def test_a_stopped_instance_lets_its_lease_go_and_another_takes_it_at_once(feed: Feed) -> None:
    holder, other = feed.listener(), feed.listener()
    holder._step()
    holder.stop()
    feed.write(2)
    assert other._step() == 0.0
    assert feed.batches == [2] and feed.lease()["owner"] == other.owner


def test_an_expired_lease_is_taken_over_where_its_holder_stopped(feed: Feed) -> None:
    holder, other = feed.listener(), feed.listener()
    holder._step()
    feed.write(2)
    holder._step()
    lease = feed.lease()
    feed.leases.replace_item(lease["id"], {**{k: v for k, v in lease.items() if not k.startswith("_")},
                                           "leaseUntil": time.time() - 1})  # its holder died a minute ago
    feed.write(1)
    assert other._step() == 0.0
    assert feed.batches == [2, 1] and feed.lease()["owner"] == other.owner



class LeaseWriteAfterEachPage:
    """The monitored container, as the reader sees it while the lease renewer writes on the same client
    between the feed's answer and the reader's look at it: after each page, a lease request."""

    def __init__(self, feed: Feed) -> None:
        self._feed = feed
        self.id = feed.monitored.id
        self.client_connection = feed.monitored.client_connection

    def query_items_change_feed(self, **options: Any) -> Any:
        feed = self._feed

        class Pages:
            def __init__(self, inner: Any) -> None:
                self._inner = inner

            def __iter__(self) -> Iterator[Any]:
                yield from self._inner
                list(feed.leases.read_all_items())

            def by_page(self) -> Iterator[Any]:
                for page in self._inner.by_page():
                    items = list(page)
                    list(feed.leases.read_all_items())
                    yield iter(items)

        return Pages(feed.monitored.query_items_change_feed(**options))


def test_the_position_saved_is_the_feed_pages_own_even_when_the_lease_was_written_since(feed: Feed) -> None:
    listener = feed.listener(monitored=LeaseWriteAfterEachPage(feed))
    listener._step()
    feed.write(3)
    assert [listener._step(), listener._step()] == [0.0, 5.0]
    assert feed.batches == [3]
    assert feed.lease()["continuation"].strip('"').isdigit()
    feed.write(2)
    listener._step()
    assert feed.batches == [3, 2]


def test_a_listener_made_while_cosmos_is_unreachable_connects_on_its_own_turn_and_retries_until_it_can(
    feed: Feed,
) -> None:
    # The Functions host starts, and serves its other triggers, while Cosmos DB is down: the trigger's client
    # is made on the listener's turn, so making the listener (at the host's start) touches nothing.
    attempts: list[int] = []

    def connect() -> tuple[Any, Any]:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionRefusedError("Cosmos DB is down")
        return feed.monitored, feed.leases

    function = Function(name="publish_outbox", function_id="id-publish", trigger={
        "type": "cosmosDBTrigger", "name": "documents", "databaseName": feed.database.id, "containerName": "orders"})
    listener = ChangeFeedListener(function, connect, f"{feed.database.id}.orders.0", lambda *_: None)
    assert attempts == []
    with pytest.raises(ConnectionRefusedError):
        listener._step()  # the polling thread logs this and waits feedPollDelay
    listener._step()
    assert len(attempts) == 2 and feed.lease()["owner"] == listener.owner


class Failing:
    """An invoke that fails its first ``failures`` calls (a worker lost mid-batch), then succeeds; counts them."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    def __call__(self, function: Function, data: dict[str, Any], _: dict[str, Any]) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            return None  # the worker gone
        return protos.InvocationResponse(result=protos.StatusResult(status=protos.StatusResult.Success))


def retrying_listener(feed: Feed, invoke: Failing, retry: Retry | None) -> ChangeFeedListener:
    function = Function(name="publish_outbox", function_id="id-publish", trigger={
        "type": "cosmosDBTrigger", "name": "documents", "databaseName": feed.database.id, "containerName": "orders"},
        retry=retry)
    return ChangeFeedListener(function, lambda: (feed.monitored, feed.leases), f"{feed.database.id}.orders.0", invoke)


def test_a_failed_batch_is_run_again_under_the_retry_policy_before_the_checkpoint_moves(feed: Feed) -> None:
    invoke = Failing(failures=2)
    listener = retrying_listener(feed, invoke, Retry(max_retry_count=5, fixed=True, delay=0.0))
    listener._step()  # the first poll: "now"
    before = feed.lease()["continuation"]
    feed.write(3)
    listener._step()
    assert invoke.calls == 3 and feed.lease()["continuation"] != before  # failed twice, then done: moved on
    listener._step()
    assert invoke.calls == 3  # nothing left to read


def test_without_a_retry_policy_or_once_it_is_spent_the_batch_is_left_behind_as_azure_does(feed: Feed) -> None:
    # The Functions host checkpoints a failed batch when no retry policy runs it again; the outbox's sweep is what
    # then finds what it left pending.
    for retry, calls in ((None, 1), (Retry(max_retry_count=2, fixed=True, delay=0.0), 3)):
        invoke = Failing(failures=10)
        listener = retrying_listener(feed, invoke, retry)
        listener._step()
        before = feed.lease()["continuation"]
        feed.write(2)
        listener._step()
        assert invoke.calls == calls and feed.lease()["continuation"] != before
        listener.stop()
        feed.leases.delete_item(feed.lease()["id"], partition_key=feed.lease()["id"])


def test_the_policy_is_read_from_the_workers_metadata_as_the_functions_host_reads_it() -> None:
    from datetime import timedelta  # noqa: PLC0415

    fixed = protos.RpcFunctionMetadata(name="f", retry_options=protos.RpcRetryOptions(
        max_retry_count=5, retry_strategy=protos.RpcRetryOptions.fixed_delay, delay_interval=timedelta(seconds=5)))
    policy = Retry.of(fixed)
    assert policy == Retry(5, True, 5.0, 0.0, 0.0) and policy.delay_seconds(3) == 5.0
    backoff = protos.RpcFunctionMetadata(name="g", retry_options=protos.RpcRetryOptions(
        max_retry_count=4, retry_strategy=protos.RpcRetryOptions.exponential_backoff,
        minimum_interval=timedelta(seconds=2), maximum_interval=timedelta(seconds=10)))
    policy = Retry.of(backoff)
    assert policy is not None and [policy.delay_seconds(n) for n in (1, 2, 3, 4)] == [2.0, 4.0, 8.0, 10.0]
    assert Retry.of(protos.RpcFunctionMetadata(name="h")) is None
