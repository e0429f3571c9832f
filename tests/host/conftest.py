"""Run apps on the local host (python -m devservers.host) against the local broker, Cosmos server and
fulfilment stand-in, and read back what happened with the SDKs only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
from azure.cosmos import ContainerProxy, PartitionKey
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

from devservers._child import start_until_listening
from devservers.azurite import Azurite
from devservers.fulfilment import FulfilmentServer
from devservers.servicebus import Broker, start_broker
from tests.support.azurite import azurite  # noqa: F401 - a fixture
from tests.support.cosmos import CosmosEndpoint, make_cosmos_client

# The worker runs azure-functions-runtime, which exists for Python 3.13 only; make test uses 3.13.
NEEDS_313 = pytest.mark.skipif(sys.version_info < (3, 13),
                               reason="the local host's worker runs azure-functions-runtime, which needs Python 3.13")
# The whole-stack runs (the demo's and the chaos suite's) take two pytest workers, each running its group's in turn
# (make test runs pytest with --dist loadgroup), so that at most two stacks of hosts compete for the 2 cores: the
# chaos smoke run, the longest, alone in one, the demo and the chaos suite's planted bug in the other.
WHOLE_STACK = pytest.mark.xdist_group("whole-stack")
WHOLE_STACK_B = pytest.mark.xdist_group("whole-stack-b")
# The shorter stack runs go beside them, in a group of their own, one after the other: the events benchmark (a
# burst, then a steady rate, about a minute), the host-path and the change-feed benchmarks.
LIGHT_STACK = pytest.mark.xdist_group("light-stack")
# The outage benchmark beside them, in a group of its own: it mostly waits out its outage and its breaker.
LIGHT_STACK_B = pytest.mark.xdist_group("light-stack-b")

ROOT = Path(__file__).resolve().parents[2]
RULES_APP = Path(__file__).resolve().parent / "rules_app"
SETTLEMENT_APP = Path(__file__).resolve().parent / "settlement_app"
ROOT_CONFIG = json.loads((ROOT / "infra/local/servicebus/Config.json").read_text())
RULE_QUEUES = {"raises": {"MaxDeliveryCount": 3}, "settles-late": {}, "unsettled": {"LockDuration": "PT2S"},
               "slow": {}, "hangs": {}, "in-sessions": {"RequiresSession": True},
               "slow-sessions": {"RequiresSession": True, "MaxDeliveryCount": 3},
               # the settlement app's; Service Bus's shortest lock, which a function outlives only if it is renewed
               "dead-letters": {}, "renews": {"LockDuration": "PT5S"},
               "renews-sessions": {"RequiresSession": True, "LockDuration": "PT5S"},
               # without duplicate detection, so that copies under one MessageId reach the consumers
               "orders-plain": {}, "order-accepted-plain": {},
               # the payments example's (examples/payments), with the Azure defaults of a new queue
               "payments": {}, "payment-booked": {}, "payment-refused": {}}


def broker_config() -> dict[str, Any]:
    """The app's queues as Config.json declares them, and the rules app's."""
    config = json.loads(json.dumps(ROOT_CONFIG))
    queues = config["UserConfig"]["Namespaces"][0]["Queues"]
    queues += [{"Name": name, "Properties": props} for name, props in RULE_QUEUES.items()]
    return dict(config)


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    with start_broker(broker_config()) as running:
        yield running


@pytest.fixture(scope="session")
def fulfilment_service() -> Iterator[FulfilmentServer]:
    with FulfilmentServer() as server:
        yield server


@dataclass
class Store:
    """A database with the app's containers, made for one test module."""

    endpoint: CosmosEndpoint
    database: str
    orders: ContainerProxy
    leases: ContainerProxy
    #: The app's AzureWebJobsStorage (the session's Azurite): its timers' lease and schedule status.
    host_storage: str

    def documents(self, order_id: str, doc_type: str | None = None) -> list[dict[str, Any]]:
        found = self.orders.query_items("SELECT * FROM c", partition_key=order_id)
        return [d for d in found if doc_type is None or d.get("type") == doc_type]


@pytest.fixture(scope="module")
def store(cosmos_endpoint: CosmosEndpoint, azurite: Azurite) -> Iterator[Store]:  # noqa: F811 - the fixture
    client = make_cosmos_client(cosmos_endpoint)
    database = client.create_database_if_not_exists(f"host-{uuid.uuid4().hex[:8]}")
    orders = database.create_container_if_not_exists("orders", PartitionKey(path="/orderId"), default_ttl=-1)
    leases = database.create_container_if_not_exists("leases", PartitionKey(path="/id"))
    yield Store(cosmos_endpoint, database.id, orders, leases, azurite.connection_string)
    client.delete_database(database.id)


@dataclass
class HostProcess:
    """One ``python -m devservers.host`` child: its process, its log, and how to stop it."""

    process: subprocess.Popen[str]
    log: IO[bytes]
    settings_file: Path
    lines: list[str] = field(default_factory=list)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode("utf-8", errors="replace")

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM, as the platform stops an instance; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def app_settings(broker: Broker, store: Store, fulfilment: FulfilmentServer, **extra: str) -> dict[str, str]:
    """The sample's values pointed at the local servers, as one app: its own host ID, so that its timers' lease
    is its own (hosts started with the same values share it)."""
    values = dict(json.loads((ROOT / "local.settings.sample.json").read_text())["Values"])
    account = f"AccountEndpoint={store.endpoint.url}/;AccountKey={store.endpoint.key};"
    values.update(ServiceBusConnection=broker.connection_string, COSMOS_ENDPOINT=store.endpoint.url,
                  COSMOS_KEY=store.endpoint.key, COSMOS_VERIFY_TLS=str(store.endpoint.verify_tls).lower(),
                  COSMOS_DATABASE=store.database, CosmosDBConnection=account, FULFILLMENT_URL=fulfilment.url,
                  ABANDON_DELAY_SECONDS="0", AzureWebJobsStorage=store.host_storage,
                  AzureFunctionsWebHost__hostid=f"host-{uuid.uuid4().hex[:12]}", **extra)
    return values


def launch(app_dir: Path, values: dict[str, str]) -> HostProcess:
    """Start one ``python -m devservers.host`` of the app in ``app_dir`` with ``values`` as its settings."""
    settings = Path(tempfile.mkdtemp()) / "local.settings.json"
    settings.write_text(json.dumps({"IsEncrypted": False, "Values": values}))
    env = {k: v for k, v in os.environ.items() if k not in values}
    process, _, log = start_until_listening(
        [sys.executable, "-m", "devservers.host", "--app-dir", str(app_dir), "--settings", str(settings)],
        startup_timeout=60, cwd=ROOT, env=env)
    return HostProcess(process, log, settings)


def stop(host: HostProcess) -> None:
    """Stop a host as the platform stops an instance, so that it lets its feed lease go (SIGTERM; SIGKILL after
    30 s)."""
    try:
        host.terminate(timeout=30)
    except subprocess.TimeoutExpired:
        host.kill()
    host.log.close()


@pytest.fixture
def start_host() -> Iterator[Callable[..., HostProcess]]:
    """Start hosts; every one still running at the end is stopped."""
    started: list[HostProcess] = []

    def start(app_dir: Path, values: dict[str, str]) -> HostProcess:
        started.append(host := launch(app_dir, values))
        return host

    yield start
    for host in started:
        stop(host)


def send(broker: Broker, queue: str, body: bytes | str, **properties: Any) -> None:
    with ServiceBusClient.from_connection_string(broker.connection_string) as client, \
            client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage(body, **properties))


def peek(broker: Broker, queue: str, *, dead_letters: bool = False) -> list[Any]:
    sub_queue = ServiceBusSubQueue.DEAD_LETTER if dead_letters else None
    with ServiceBusClient.from_connection_string(broker.connection_string) as client, \
            client.get_queue_receiver(queue, sub_queue=sub_queue) as receiver:
        return list(receiver.peek_messages(max_message_count=100))


def eventually(check: Callable[[], Any], timeout: float = 30, what: str = "the condition") -> Any:
    """Poll until ``check`` returns something truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if result := check():
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout} s")
        time.sleep(0.2)
