"""``make run``: the whole local stack in the foreground, on the ports ``local.settings.sample.json`` names.

Starts the local Service Bus broker (``infra/local/servicebus/Config.json``, port 5672), the local
Cosmos DB server (8081) with the database and containers created, Azurite (10000-10002, data in
``.azurite``; the sample's ``AzureWebJobsStorage=UseDevelopmentStorage=true``), the fulfilment stand-in (7072),
and the local Functions host on the sample's settings; then waits. Ctrl-C (or SIGTERM) stops the
host first, so that in-flight invocations finish, then the servers, in reverse order.

    python -m devservers.run [--settings local.settings.sample.json]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

from devservers._child import ChildStartupError, start_until_listening
from devservers.stopsignal import StopSignals

ROOT = Path(__file__).resolve().parents[2]  # the project root, above tools/
SERVERS = (
    ("Service Bus broker", ["-m", "devservers.servicebus", "--config", "infra/local/servicebus/Config.json",
                            "--port", "5672"]),
    ("Cosmos DB server", ["-m", "devservers.cosmos", "--port", "8081"]),
    # AzureWebJobsStorage=UseDevelopmentStorage=true: the timers' lease and schedule status, kept in .azurite.
    ("Azurite", ["-m", "devservers.azurite"]),
    ("fulfilment stand-in", ["-m", "devservers.fulfilment", "--port", "7072"]),
)
SETUP = ["-m", "devservers.cosmos_setup", "--endpoint", "http://127.0.0.1:8081", "--no-verify-tls"]


def main(argv: list[str] | None = None) -> int:
    """Start everything, wait for a signal, stop everything."""
    parser = argparse.ArgumentParser(prog="python -m devservers.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", type=Path, default=ROOT / "local.settings.sample.json",
                        help="the host's settings (default: local.settings.sample.json)")
    args = parser.parse_args(argv)
    stop = StopSignals()
    running: list[tuple[str, subprocess.Popen[str], IO[bytes]]] = []
    try:
        for name, command in (*SERVERS, ("local Functions host", ["-m", "devservers.host", "--app-dir", str(ROOT),
                                                                   "--settings", str(args.settings)])):
            if name == "local Functions host":
                subprocess.run([sys.executable, *SETUP], cwd=ROOT, check=True)
            process, address, log = start_until_listening([sys.executable, *command], startup_timeout=90, cwd=ROOT)
            running.append((name, process, log))
            print(f"{name}: {address}", flush=True)
        print("ready: send with python -m sbctl send ...; Ctrl-C stops everything", flush=True)
        _follow(running[-1][2], stop)
    except ChildStartupError as exc:
        print(f"error: {exc.with_stderr('a server did not start (is its port in use?)')}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError:
        print("error: creating the Cosmos DB database and containers failed (see above)", file=sys.stderr)
        return 1
    finally:
        for _name, process, log in reversed(running):
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
            log.close()
    return 0


def _follow(log: IO[bytes], stop: StopSignals) -> None:
    """Copy the host's log to our stderr until told to stop."""
    position = 0
    while not stop.wait(0.5):
        log.seek(position)
        chunk = log.read()
        position += len(chunk)
        sys.stderr.write(chunk.decode("utf-8", errors="replace"))
        sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
