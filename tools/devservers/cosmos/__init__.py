"""Local Cosmos DB (NoSQL API) server for tests and workstation runs; not deployed.

It runs ``launcher.js`` under Node: npm ``@vercel/cosmosdb-server`` (pinned in ``package.json``) with
the corrections the launcher documents (404s, atomic transactional batch, TTL, partition-scoped
queries, case-sensitive patch filter predicates, HTTP keep-alive, Cosmos' refusals of invalid TTLs,
long ids and items over 2 MB, empty answers to ``no_response`` writes, an incremental change feed
that ``ContainerProxy.query_items_change_feed`` reads and resumes, and requests whose cost follows what
they touch: partition-scoped queries from a per-partition index, pages resumed at their continuation, no
scan of the container for expiry; ``python -m devservers.cosmos.measure`` times them). Install it once
with ``npm ci --prefix tools/devservers/cosmos``.

The server speaks plain HTTP on loopback and does not check keys, so connect with::

    CosmosClient(server.endpoint, credential=EMULATOR_KEY, enable_endpoint_discovery=False)

Data lives in memory and is gone when the server stops.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from devservers import _child

__all__ = ["EMULATOR_KEY", "CosmosServer", "CosmosServerError", "start_cosmos_server"]

#: The well-known, public key of the Cosmos DB emulator. The local server accepts any key; the real
#: emulator accepts only this one.
EMULATOR_KEY = "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DXwjiK6Nx8fTkhmE64wWBNYjRzHlNcQ6eYpRlGdXAWRLFA=="

PACKAGE_DIR = Path(__file__).resolve().parent
LAUNCHER = PACKAGE_DIR / "launcher.js"
_SERVER_PACKAGE_JSON = PACKAGE_DIR / "node_modules" / "@vercel" / "cosmosdb-server" / "package.json"
_INSTALL_HINT = "run `npm ci --prefix tools/devservers/cosmos` from the repository root"


class CosmosServerError(RuntimeError):
    """The local Cosmos server could not be started."""


def launcher_command(host: str, port: int, *, verbose: bool = False) -> list[str]:
    """The command line that runs the launcher; raises CosmosServerError if Node or the package is missing.

    ``verbose``: the launcher writes one line per request to stderr (operation, method, path, status).
    """
    node = shutil.which("node")
    if node is None:
        raise CosmosServerError("`node` is not on PATH; the local Cosmos server needs Node.js 20 or newer")
    if not _SERVER_PACKAGE_JSON.is_file():
        raise CosmosServerError(f"@vercel/cosmosdb-server is not installed; {_INSTALL_HINT}")
    return [node, str(LAUNCHER), "--host", host, "--port", str(port), *(["--verbose"] if verbose else [])]


class CosmosServer:
    """A running local Cosmos server. Stop it with :meth:`stop` or use it as a context manager."""

    def __init__(self, process: subprocess.Popen[str], endpoint: str, stderr: IO[bytes]) -> None:
        self._process = process
        self._stderr = stderr
        #: Base URL, e.g. ``http://127.0.0.1:50123``.
        self.endpoint = endpoint
        #: Any key works; this is the emulator's, for symmetry with the real emulator.
        self.key = EMULATOR_KEY

    @property
    def running(self) -> bool:
        return self._process.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout`` seconds). Safe to call twice."""
        _child.stop(self._process, timeout)
        self._stderr.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_cosmos_server(host: str = "127.0.0.1", port: int = 0, *, startup_timeout: float = 30.0) -> CosmosServer:
    """Start the local Cosmos server and wait until it listens.

    ``port=0`` picks a free port; read the result from ``.endpoint``. The server exits by itself if
    this process dies (its stdin is a pipe from us). Raises CosmosServerError, with the server's
    stderr, if it does not come up within ``startup_timeout`` seconds.
    """
    command = [*launcher_command(host, port), "--exit-on-stdin-close"]
    try:
        process, endpoint, stderr = _child.start_until_listening(
            command, startup_timeout=startup_timeout, cwd=PACKAGE_DIR, stdin=subprocess.PIPE
        )
    except _child.ChildStartupError as failure:
        raise CosmosServerError(_startup_failure(failure)) from None
    return CosmosServer(process, endpoint, stderr)


def _startup_failure(failure: _child.ChildStartupError) -> str:
    if failure.line:
        reason = f"printed {failure.line.strip()!r} instead of `listening on ...`"
    elif failure.timed_out:
        reason = "did not report `listening on` in time"
    else:
        reason = f"exited with status {failure.returncode}"
    message = failure.with_stderr(f"local Cosmos server ({' '.join(failure.command)}) {reason}")
    if "npm ci" not in message and ("Cannot find module" in failure.stderr or "MODULE_NOT_FOUND" in failure.stderr):
        message += f"\n{_INSTALL_HINT}"
    return message
