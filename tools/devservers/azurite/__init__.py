"""Azurite, Azure's Storage emulator, for the local Functions host's ``AzureWebJobsStorage``; not deployed.

The Functions host keeps its timers' state in ``AzureWebJobsStorage``: the listener lease that makes one
instance the timer's runner, and the schedule monitor's status (``devservers.host.singleton``). The local
stack runs Azurite from npm (``azurite`` pinned at 3.35.0 in ``package.json``: the last release that runs on
Node 20; 3.36 and later need Node 21 or newer) with Blob, Queue and Table on loopback. Install it once with
``npm ci --prefix tools/devservers/azurite`` (``make setup`` does).

``make run`` starts it on the default ports (10000-10002), where ``UseDevelopmentStorage=true`` points;
the demo, the chaos suite and the tests start one per stack on free ports and connect by
:attr:`Azurite.connection_string`, which names the development account and its endpoints.
"""

from __future__ import annotations

import queue
import re
import shutil
import subprocess
import threading
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from devservers import _child

__all__ = ["ACCOUNT", "ACCOUNT_KEY", "Azurite", "AzuriteError", "azurite_command", "start_azurite"]

#: Azurite's well-known development account and its public key (also what UseDevelopmentStorage=true means).
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
SERVICES = ("Blob", "Queue", "Table")
#: The ports UseDevelopmentStorage=true points at.
DEFAULT_PORTS = {"Blob": 10000, "Queue": 10001, "Table": 10002}
PACKAGE_DIR = Path(__file__).resolve().parent
LAUNCHER = PACKAGE_DIR / "launcher.js"
_PACKAGE_JSON = PACKAGE_DIR / "node_modules" / "azurite" / "package.json"
_INSTALL_HINT = "run `npm ci --prefix tools/devservers/azurite` from the repository root (make setup does)"
_LISTENING = re.compile(r"Azurite (Blob|Queue|Table) service is successfully listening at (http://\S+)")


class AzuriteError(RuntimeError):
    """Azurite could not be started."""


def azurite_command(host: str, ports: dict[str, int], location: Path | None) -> list[str]:
    """The command line that runs Azurite; raises AzuriteError if Node or the package is missing.

    ``location`` keeps its data in that folder across runs; None keeps it in memory until it stops.
    """
    node = shutil.which("node")
    if node is None:
        raise AzuriteError("`node` is not on PATH; Azurite needs Node.js 20")
    if not _PACKAGE_JSON.is_file():
        raise AzuriteError(f"azurite is not installed; {_INSTALL_HINT}")
    command = [node, str(LAUNCHER), "--silent", "--disableTelemetry", "--skipApiVersionCheck"]
    for service in SERVICES:
        command += [f"--{service.lower()}Host", host, f"--{service.lower()}Port", str(ports[service])]
    return [*command, *(["--location", str(location)] if location else ["--inMemoryPersistence"])]


class Azurite:
    """A running Azurite. Stop it with :meth:`stop` or use it as a context manager."""

    def __init__(self, process: subprocess.Popen[str], endpoints: dict[str, str]) -> None:
        self._process = process
        #: Each service's base URL, e.g. ``{"Blob": "http://127.0.0.1:10000", ...}``.
        self.endpoints = endpoints

    @property
    def connection_string(self) -> str:
        """The development account with this Azurite's endpoints, for ``AzureWebJobsStorage``."""
        if all(self.endpoints[s].endswith(f":{DEFAULT_PORTS[s]}") for s in SERVICES) and \
                "127.0.0.1" in self.endpoints["Blob"]:
            return "UseDevelopmentStorage=true"
        return ";".join(["DefaultEndpointsProtocol=http", f"AccountName={ACCOUNT}", f"AccountKey={ACCOUNT_KEY}",
                         *(f"{s}Endpoint={self.endpoints[s]}/{ACCOUNT}" for s in SERVICES)]) + ";"

    @property
    def running(self) -> bool:
        return self._process.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        """Stop Azurite (SIGTERM, then SIGKILL after ``timeout`` seconds). Safe to call twice."""
        _child.stop(self._process, timeout)

    def wait(self) -> int:
        """Wait until Azurite exits; its exit status."""
        return self._process.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def start_azurite(host: str = "127.0.0.1", ports: dict[str, int] | None = None, *, location: Path | None = None,
                  startup_timeout: float = 30.0) -> Azurite:
    """Start Azurite and wait until its three services listen.

    ``ports`` default to 0 each (free ports; read them from ``.endpoints``). It exits by itself if this process
    dies (its stdin is a pipe from us). Raises AzuriteError, with what it printed, if it does not come up.
    """
    command = [*azurite_command(host, ports or dict.fromkeys(SERVICES, 0), location), "--exit-on-stdin-close"]
    process = subprocess.Popen(command, cwd=PACKAGE_DIR, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_drain, args=(process.stdout, lines), name="azurite output", daemon=True).start()
    endpoints: dict[str, str] = {}
    printed: list[str] = []
    while len(endpoints) < len(SERVICES):
        try:
            line = lines.get(timeout=startup_timeout)
        except queue.Empty:
            line = ""
        if not line:
            _child.stop(process, 5)
            raise AzuriteError(f"Azurite ({' '.join(command)}) did not start: "
                               f"{' | '.join(printed[-5:]) or 'it printed nothing'}"
                               + (f"; {_INSTALL_HINT}" if "Cannot find module" in "".join(printed) else ""))
        printed.append(line.strip())
        if found := _LISTENING.search(line):
            endpoints[found.group(1)] = found.group(2).rstrip("/")
    return Azurite(process, endpoints)


def _drain(stream: IO[str], lines: queue.Queue[str]) -> None:
    """Read Azurite's output to its end (so that its pipe never fills), handing on each line; "" at the end."""
    try:
        for line in stream:
            lines.put(line)
    except (OSError, ValueError):
        pass  # stop() closed our end
    lines.put("")
