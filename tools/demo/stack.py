"""The local stack the demo runs on: broker and fulfilment stand-in in this process, the Cosmos server, Azurite
(the hosts' AzureWebJobsStorage) and the local Functions hosts as child processes. Everything listens on loopback
ports the OS picks."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from devservers._child import start_until_listening
from devservers.azurite import Azurite, start_azurite
from devservers.cosmos import CosmosServer, start_cosmos_server
from devservers.cosmos_setup import container_specs, ensure_containers, make_client
from devservers.fulfilment import FulfilmentServer
from devservers.identity import IdentityServer, Tokens
from devservers.servicebus import Broker, start_broker

ROOT = Path(__file__).resolve().parents[2]  # the project root, above tools/
DETECTION_WINDOW_SECONDS = 10
# The fulfilment stand-in's application ID URI: the app asks the local identity endpoint for a token for it.
FULFILMENT_AUDIENCE = "api://fulfilment"
LOCK_SECONDS = 10


def broker_config(lock_seconds: int = LOCK_SECONDS) -> dict[str, Any]:
    """infra/local's Config.json with a 10-second detection window and a short lock on the input queues, so
    that the demo's late copies and its killed host's redeliveries come within minutes."""
    config: dict[str, Any] = json.loads((ROOT / "infra/local/servicebus/Config.json").read_text())
    for queue in config["UserConfig"]["Namespaces"][0]["Queues"]:
        if queue["Name"] in ("orders", "order-events", "order-events-plain"):  # order-accepted keeps its window
            queue["Properties"].update(DuplicateDetectionHistoryTimeWindow=f"PT{DETECTION_WINDOW_SECONDS}S",
                                       LockDuration=f"PT{lock_seconds}S")
    return config


@dataclass
class HostProcess:
    """One local Functions host child: its process and its log file."""

    process: subprocess.Popen[str]
    log: IO[bytes]

    def text(self) -> str:
        """The host's log so far (its lines, and its worker's)."""
        self.log.seek(0)
        return self.log.read().decode("utf-8", errors="replace")


def settings_file(values: dict[str, str]) -> Path:
    """A local.settings.json holding ``values``, in a new temporary folder."""
    path = Path(tempfile.mkdtemp(prefix="demo-")) / "local.settings.json"
    path.write_text(json.dumps({"IsEncrypted": False, "Values": values}))
    return path


def workers_of(host: HostProcess) -> list[int]:
    """The host's worker processes."""
    workers = []
    # Every thread's children: a worker the host restarted is the child of the thread that restarted it.
    for children in Path(f"/proc/{host.process.pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):  # the thread or the host is gone already
            workers += [int(p) for p in children.read_text().split()]
    return workers


def sigkill(host: HostProcess, *, worker_only: bool) -> None:
    """SIGKILL the host's worker, and the host too unless ``worker_only`` (its host then restarts it)."""
    workers = workers_of(host)
    if not worker_only:
        host.process.kill()  # first, so that it cannot restart the worker
    for worker in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)


def pause(host: HostProcess, *, stopped: bool) -> None:
    """SIGSTOP the host and its workers (a slow instance: nothing of it runs, its locks run on), or SIGCONT them."""
    for pid in (host.process.pid, *workers_of(host)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP if stopped else signal.SIGCONT)


@dataclass
class Stack:
    """The running servers and hosts."""

    broker: Broker
    cosmos: CosmosServer
    fulfilment: FulfilmentServer
    azurite: Azurite
    settings_file: Path
    values: dict[str, str]
    hosts: list[HostProcess] = field(default_factory=list)
    retired: list[HostProcess] = field(default_factory=list)
    # The local managed-identity endpoint the hosts' workers read (IDENTITY_ENDPOINT, IDENTITY_HEADER), as on
    # Functions: the fulfilment stand-in admits only its tokens for FULFILMENT_AUDIENCE.
    identity: IdentityServer | None = None
    events_sessions: bool = True  # the events queue: order-events with sessions, or order-events-plain without

    @property
    def events_queue(self) -> str:
        """The queue the app's events go to."""
        return "order-events" if self.events_sessions else "order-events-plain"

    @classmethod
    def start(cls, lock_seconds: int = LOCK_SECONDS, *, events_sessions: bool = True,
              fulfilment: Mapping[str, Any] | None = None, token_lifetime: float = 3600.0,
              token_leeway: float = Tokens.leeway) -> Stack:
        """Start the broker, the Cosmos server (database and containers made) and the fulfilment stand-in (with
        ``fulfilment``'s keywords: its behaviours, ``FulfilmentServer``); the app's events go to a session queue,
        or with ``events_sessions`` false to a plain one. The local identity endpoint's tokens live
        ``token_lifetime`` seconds (a managed identity's live for hours in Azure), and the stand-in takes one up to
        ``token_leeway`` seconds past its expiry."""
        broker = start_broker(broker_config(lock_seconds))
        cosmos = start_cosmos_server()
        ensure_containers(make_client(cosmos.endpoint, verify_tls=False), "sales", container_specs())
        identity = IdentityServer(Tokens(lifetime=token_lifetime, leeway=token_leeway)).start()
        server = FulfilmentServer(**(fulfilment or {}), tokens=identity.tokens, audience=FULFILMENT_AUDIENCE).start()
        azurite = start_azurite()
        values = json.loads((ROOT / "local.settings.sample.json").read_text())["Values"]
        values.update(
            ServiceBusConnection=broker.connection_string, COSMOS_ENDPOINT=cosmos.endpoint, COSMOS_KEY=cosmos.key,
            CosmosDBConnection=f"AccountEndpoint={cosmos.endpoint}/;AccountKey={cosmos.key};",
            FULFILLMENT_URL=server.url, FULFILLMENT_READ_TIMEOUT_SECONDS="2", ABANDON_DELAY_SECONDS="2",
            SERVICEBUS_LOCK_DURATION_SECONDS=str(lock_seconds), OUTBOX_STUCK_AFTER_SECONDS="20",
            OUTBOX_SWEEP_SCHEDULE="*/10 * * * * *", AzureWebJobsStorage=azurite.connection_string,
            # One app: its hosts share a host ID, so that one of them holds each timer's lease in Azurite, as on Azure.
            AzureFunctionsWebHost__hostid=f"stack-{uuid.uuid4().hex[:12]}",
            ORDER_EVENTS_QUEUE="order-events" if events_sessions else "order-events-plain",
            ORDER_EVENTS_SESSIONS=str(events_sessions).lower(),
            FULFILLMENT_TOKEN_SCOPE=f"{FULFILMENT_AUDIENCE}/.default", **identity.environment(),
        )
        return cls(broker, cosmos, server, azurite, settings_file(values), values, events_sessions=events_sessions,
                   identity=identity)

    def start_host(self, settings: Path | None = None, app_dir: Path = ROOT) -> HostProcess:
        """Start one more host process, competing with the others; wait until it listens.

        ``settings`` is a local.settings.json (default: the stack's); ``app_dir`` the app (default: ours).
        """
        process, _, log = start_until_listening(
            [sys.executable, "-m", "devservers.host", "--app-dir", str(app_dir), "--settings",
             str(settings or self.settings_file)], startup_timeout=120, cwd=ROOT)
        host = HostProcess(process, log)
        self.hosts.append(host)
        return host

    def kill_host(self, host: HostProcess) -> None:
        """SIGKILL a host and its worker: what they held comes back once the locks expire."""
        sigkill(host, worker_only=False)
        host.process.wait(10)
        self.hosts.remove(host)
        self.retired.append(host)

    def stop_host(self, host: HostProcess) -> None:
        """Stop one host as the platform does when it takes an instance away: SIGTERM, and it finishes the
        invocations in hand (SIGKILL after a minute)."""
        host.process.send_signal(signal.SIGTERM)
        try:
            host.process.wait(60)
        except subprocess.TimeoutExpired:
            sigkill(host, worker_only=False)
            host.process.wait(10)
        self.hosts.remove(host)
        self.retired.append(host)

    def logs(self) -> str:
        """Every host's log, the retired ones' included, each under a line naming it."""
        return "".join(f"===== host {n} (pid {host.process.pid})\n{host.text()}\n"
                       for n, host in enumerate((*self.retired, *self.hosts), 1))

    def stop_hosts(self) -> None:
        """Stop the hosts; each lets its in-flight invocations finish."""
        for host in self.hosts:
            if host.process.poll() is None:
                host.process.send_signal(signal.SIGTERM)
        for host in self.hosts:
            try:
                host.process.wait(60)
            except subprocess.TimeoutExpired:
                host.process.kill()
        self.retired += self.hosts
        self.hosts = []

    def stop(self) -> None:
        """Stop the hosts, then the servers."""
        self.stop_hosts()
        self.fulfilment.stop()
        if self.identity is not None:
            self.identity.stop()
        self.azurite.stop()
        self.cosmos.stop()
        self.broker.stop()
