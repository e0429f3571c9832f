"""A local AMQP 1.0 broker that the unmodified ``azure-servicebus`` SDK can talk to; for tests only.

It is a test peer for Service Bus's wire contract (see README.md in this directory for what it does
and does not do), configured with the official emulator's ``Config.json``. Connect with
:func:`connection_string`, which sets ``UseDevelopmentEmulator=true`` so the SDK uses plain AMQP on
the given port::

    with start_broker("infra/local/servicebus/Config.json") as broker:
        client = ServiceBusClient.from_connection_string(broker.connection_string)

:func:`start_broker` runs the broker on a thread in this process; :func:`start_broker_process` runs
``python -m devservers.servicebus`` exactly as the command line does. State lives in memory only.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from devservers import _child
from devservers._child import READY_PREFIX as READY_PREFIX
from devservers.servicebus.config import ConfigError, NamespaceConfig, load_config
from devservers.servicebus.server import ReactorThreadBroker
from devservers.servicebus.store import Namespace

__all__ = [
    "Broker",
    "BrokerProcess",
    "BrokerStartError",
    "ConfigError",
    "connection_string",
    "start_broker",
    "start_broker_process",
]

_TOOLS_ROOT = Path(__file__).resolve().parents[2]  # tools/, the directory that holds devservers/


class BrokerStartError(RuntimeError):
    """The broker did not come up."""


def connection_string(host: str, port: int) -> str:
    """The connection string the SDK needs: any key works; ``UseDevelopmentEmulator=true`` turns TLS off."""
    return (
        f"Endpoint=sb://{host}:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
    )


class Broker:
    """The broker on a background thread of this process.

    It listens from construction (so ``.port`` is known, also for ``port=0``) and serves once
    :meth:`start` is called; stop it with :meth:`stop` or ``with``. Its state belongs to the reactor
    thread: observe it through the SDK, like any client.
    """

    def __init__(self, config: NamespaceConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config
        self._runner = ReactorThreadBroker(Namespace(config), host, port)
        self.host = host
        self.port = self._runner.port

    @property
    def connection_string(self) -> str:
        return connection_string(self.host, self.port)

    @property
    def running(self) -> bool:
        return self._runner.running

    def start(self) -> Self:
        self._runner.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Close every connection and stop the reactor thread. Safe to call twice."""
        self._runner.stop(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_broker(config: str | Path | dict[str, Any], host: str = "127.0.0.1", port: int = 0) -> Broker:
    """Start a broker on a background thread; ``config`` is a Config.json path or its parsed content.

    ``port=0`` picks a free port (read it from ``.port``). Raises ConfigError for an invalid config.
    """
    return Broker(load_config(config), host, port).start()


class BrokerProcess:
    """The broker run as ``python -m devservers.servicebus`` in a child process."""

    def __init__(
        self,
        process: subprocess.Popen[str],
        host: str,
        port: int,
        stderr: IO[bytes],
        config_file: Path | None = None,
    ) -> None:
        self.process = process
        self.host = host
        self.port = port
        self._stderr = stderr
        self._config_file = config_file  # written by start_broker_process; removed on stop

    @property
    def connection_string(self) -> str:
        return connection_string(self.host, self.port)

    def stderr_text(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def stop(self, timeout: float = 5.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit status. Safe to call twice."""
        status = _child.stop(self.process, timeout)
        if self._config_file is not None:
            self._config_file.unlink(missing_ok=True)
            self._config_file = None
        return status

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        self._stderr.close()


def start_broker_process(
    config: str | Path | dict[str, Any],
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    startup_timeout: float = 15.0,
    python: str = sys.executable,
) -> BrokerProcess:
    """Run the command-line broker in a child process and wait for its ``listening on`` line.

    A dict config is written to a temporary file first. Raises BrokerStartError (with the child's
    stderr) if the line does not come within ``startup_timeout`` seconds.
    """
    written: Path | None = None
    if isinstance(config, dict):
        handle = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8")  # noqa: SIM115
        with handle:
            json.dump(config, handle)
        config_path = handle.name
        written = Path(handle.name)
    else:
        config_path = str(config)
    command = [python, "-m", "devservers.servicebus", "--config", config_path, "--host", host, "--port", str(port)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_TOOLS_ROOT), env.get("PYTHONPATH")]))
    try:
        process, address, stderr = _child.start_until_listening(command, startup_timeout=startup_timeout, env=env)
    except _child.ChildStartupError as failure:
        if written is not None:
            written.unlink(missing_ok=True)
        raise BrokerStartError(failure.with_stderr(str(failure))) from None
    bound_host, _, bound_port = address.rpartition(":")
    return BrokerProcess(process, bound_host, int(bound_port), stderr, written)


logging.getLogger("devservers.servicebus").addHandler(logging.NullHandler())
