"""The local host: one loopback gRPC port (FunctionRpc EventStream and Settlement), a worker child, and
a listener per trigger the worker reports.

Settings are ``local.settings.json``'s ``Values`` with the process environment winning, as
``func start`` does; ``host.json`` gives the Service Bus options, the timers' ``singleton`` lease and
``functionTimeout``, and an app
setting ``AzureFunctionsJobHost__extensions__serviceBus__maxConcurrentCalls`` overrides its value; names
match whatever their case, as the host's configuration does. An
invocation that outlives ``functionTimeout``, or a worker that exits, restarts the worker, as the host
does: every invocation in flight dies with it, and their messages are abandoned. ``stop`` stops receiving,
lets what runs finish, then stops the worker.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from devservers.host.channel import EventStreamService, WorkerGone
from devservers.host.process import Function, HostError, WorkerProcess
from devservers.host.protos import protos
from devservers.host.servicebus import ServiceBusOptions
from devservers.host.settlement import Deliveries, add_settlement

logger = logging.getLogger("devservers.host")
START_WAIT_SECONDS = 120
# .NET's TimeSpan.Parse forms, which the host's configuration binder reads host.json with: d, or [d.]hh:mm[:ss[.f]].
_DURATION = re.compile(r"^(?:(?P<only_days>\d+)|(?:(?P<days>\d+)\.)?(?P<hours>\d+):(?P<minutes>\d+)"
                       r"(?::(?P<seconds>\d+(?:\.\d+)?))?)$")


@dataclass(frozen=True)
class SingletonOptions:
    """The timers' listener lease (``devservers.host.singleton``), as host.json's ``singleton`` section sets it:
    Azure's defaults, not Core Tools' (which runs the host as Development, where the lease lasts 15 s)."""

    listener_lock_period: float = 60.0
    listener_lock_recovery_polling_interval: float = 60.0


class Listener(Protocol):
    """A trigger's listener: it starts, and stops after what it runs has finished."""

    def start(self) -> None:
        """Start listening."""

    def stop(self) -> None:
        """Stop listening; in-flight invocations finish first."""


def timespan_seconds(text: str) -> float:
    """A host.json TimeSpan such as ``00:05:00``, ``1.02:00:00``, ``00:30`` or ``0`` (days), in seconds."""
    match = _DURATION.match(str(text).strip())
    if match is None:
        raise HostError(f"host.json: {text!r} is not a TimeSpan such as 00:05:00")
    if match["only_days"] is not None:
        return int(match["only_days"]) * 86400.0
    days = int(match["days"] or 0)
    return ((days * 24 + int(match["hours"])) * 60 + int(match["minutes"])) * 60 + float(match["seconds"] or 0)


def _flag(value: object) -> bool:
    """A host.json boolean, or an app setting's text for one (``false`` from an app setting is false)."""
    return value.strip().lower() == "true" if isinstance(value, str) else bool(value)


def _get(node: dict[str, Any], key: str, default: Any = None) -> Any:
    """``node[key]`` whatever the key's case, as the host's configuration reads host.json and app settings."""
    return next((value for name, value in node.items() if name.lower() == key.lower()), default)


@dataclass(frozen=True)
class HostConfig:
    """What the host was told: the app, its settings and host.json."""

    app_dir: Path
    settings: dict[str, str]
    host_json: dict[str, Any]

    @classmethod
    def load(cls, app_dir: Path, settings_file: Path | None) -> HostConfig:
        """Read host.json and the settings file (if any), the process environment winning."""
        host_json_path = app_dir / "host.json"
        if not host_json_path.is_file():
            raise HostError(f"{host_json_path} not found: --app-dir must be a Functions app")
        values: dict[str, str] = {}
        if settings_file is not None:
            try:
                values = {k: str(v) for k, v in json.loads(settings_file.read_text())["Values"].items()}
            except (OSError, ValueError, KeyError) as exc:
                raise HostError(f"{settings_file}: cannot read its Values ({type(exc).__name__}: {exc})") from None
        settings = {**values, **os.environ}
        return cls(app_dir, settings, _overridden(json.loads(host_json_path.read_text()), settings))

    def service_bus(self) -> ServiceBusOptions:
        """extensions.serviceBus, with the host's defaults."""
        section = _get(_get(self.host_json, "extensions", {}), "serviceBus", {})
        defaults = ServiceBusOptions()
        idle = _get(section, "sessionIdleTimeout")
        return ServiceBusOptions(
            max_concurrent_calls=int(_get(section, "maxConcurrentCalls", defaults.max_concurrent_calls)),
            max_concurrent_sessions=int(_get(section, "maxConcurrentSessions", defaults.max_concurrent_sessions)),
            max_auto_lock_renewal_seconds=timespan_seconds(_get(section, "maxAutoLockRenewalDuration", "00:05:00")),
            prefetch_count=int(_get(section, "prefetchCount", defaults.prefetch_count)),
            auto_complete_messages=_flag(_get(section, "autoCompleteMessages", True)),
            session_idle_timeout_seconds=timespan_seconds(idle) if idle else None,
            try_timeout_seconds=timespan_seconds(_get(_get(section, "clientRetryOptions", {}), "tryTimeout",
                                                      "00:01:00")),
        )

    def singleton(self) -> SingletonOptions:
        """host.json's ``singleton`` section, with the host's defaults and its bounds (``SingletonOptions``)."""
        section = _get(self.host_json, "singleton", {})
        period = timespan_seconds(str(_get(section, "listenerLockPeriod", "00:01:00")))
        recovery = timespan_seconds(str(_get(section, "listenerLockRecoveryPollingInterval", "00:01:00")))
        if not 15 <= period <= 60:
            raise HostError(f"host.json: singleton.listenerLockPeriod must be 15 to 60 seconds, not {period:g}")
        if recovery < 15:
            raise HostError("host.json: singleton.listenerLockRecoveryPollingInterval must be 15 seconds or more, "
                            f"not {recovery:g}")
        return SingletonOptions(listener_lock_period=period, listener_lock_recovery_polling_interval=recovery)

    def function_timeout(self) -> float | None:
        """functionTimeout in seconds; None for ``-1`` (no limit)."""
        text = str(_get(self.host_json, "functionTimeout", "00:05:00"))
        return None if text.strip() == "-1" else timespan_seconds(text)


def _overridden(host_json: dict[str, Any], settings: dict[str, str]) -> dict[str, Any]:
    """host.json with the app settings ``AzureFunctionsJobHost__a__b`` applied at path a.b, as the host does:
    each part names the key of host.json that matches it whatever the case, or a new one."""
    for name, value in settings.items():
        if not name.lower().startswith("azurefunctionsjobhost__"):
            continue
        *parents, leaf = name.split("__")[1:]
        node = host_json
        for part in parents:
            key = _key(node, part)
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[_key(node, leaf)] = value
    return host_json


def _key(node: dict[str, Any], part: str) -> str:
    """The key of ``node`` that ``part`` names whatever the case; ``part`` itself when there is none."""
    return next((name for name in node if name.lower() == part.lower()), part)


class Host:
    """Runs one Functions app locally: gRPC server, worker, listeners."""

    def __init__(self, config: HostConfig, host: str = "127.0.0.1") -> None:
        self.config = config
        self.deliveries = Deliveries()
        self._events = EventStreamService()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="host-grpc"),
                                   options=[("grpc.max_send_message_length", 2**31 - 1),
                                            ("grpc.max_receive_message_length", 2**31 - 1)])
        protos.add_FunctionRpcServicer_to_server(self._events, self._server)
        add_settlement(self._server, self.deliveries)
        port = self._server.add_insecure_port(f"{host}:0")
        self.address = (host, port)
        self._worker: WorkerProcess | None = None
        self._worker_lock = threading.Lock()
        self._worker_ready = threading.Event()
        self._stopping = threading.Event()
        self._listeners: list[Listener] = []
        self._timeout = config.function_timeout()
        self.functions: list[Function] = []

    def start(self) -> None:
        """Serve, start the worker, learn the functions, start a listener per trigger."""
        self._server.start()
        self.functions = self._start_worker()
        from devservers.host.listeners import listeners_for  # noqa: PLC0415 - imports the SDKs of the triggers

        self._listeners = listeners_for(self)
        for listener in self._listeners:
            listener.start()
        logger.info("host ready: %d functions on %s:%d (%s)", len(self.functions), *self.address,
                    ", ".join(f"{f.name} [{f.trigger_type}]" for f in self.functions))

    def _start_worker(self) -> list[Function]:
        worker = WorkerProcess(self._events, self.address, self.config.app_dir, dict(self.config.settings))
        functions = worker.start()
        with self._worker_lock:
            self._worker = worker
        self._worker_ready.set()
        return functions

    def invoke(self, function: Function, inputs: dict[str, Any], trigger_metadata: dict[str, Any]) -> Any:
        """Invoke on the current worker; None when it died or timed out (then it is restarted).

        While a worker restarts, invocations wait for it rather than fail: a failure would abandon the
        message, and Service Bus would offer it again at once.
        """
        self._worker_ready.wait(START_WAIT_SECONDS)
        with self._worker_lock:
            worker = self._worker
        if worker is None:
            return None
        try:
            return worker.invoke(function, inputs, trigger_metadata, self._timeout)
        except WorkerGone:
            self._restart(worker, f"{function.name}: the worker exited: restarting it; invocations in flight died"
                                  " with it")
            return None
        except TimeoutError:
            self._restart(worker, f"{function.name} exceeded functionTimeout ({self._timeout or 0:.0f} s): restarting"
                                  " the worker; invocations in flight die with it")
            return None

    def _restart(self, worker: WorkerProcess, why: str) -> None:
        """Replace ``worker`` with a new one, as the host does when its language worker dies or hangs;
        a start that fails is tried again until one succeeds or the host stops."""
        with self._worker_lock:
            if self._worker is not worker or self._stopping.is_set():
                return  # already restarted for another invocation, or the host is stopping
            self._worker = None
            self._worker_ready.clear()
        logger.error("%s", why)
        worker.kill()
        while not self._stopping.is_set():
            try:
                self._start_worker()
                return
            except HostError as exc:
                logger.error("restarting the worker failed (%s); trying again", exc)

    def stop(self, grace: float = 30.0) -> None:
        """Stop receiving, let in-flight invocations finish, stop the worker and the server."""
        self._stopping.set()
        # All at once: each waits for its in-flight invocations (not for a session slot still waiting on an accept).
        stopping = [threading.Thread(target=listener.stop, name="stop-listener") for listener in self._listeners]
        for thread in stopping:
            thread.start()
        for thread in stopping:
            thread.join()
        with self._worker_lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop(grace)
        self._server.stop(grace=1).wait()

    def wait_idle(self, timeout: float) -> bool:
        """Whether no message invocation is running within ``timeout`` seconds (for tests and drains)."""
        deadline = time.monotonic() + timeout
        while self.deliveries.count():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True
