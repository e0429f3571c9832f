"""Run the local Cosmos server in the foreground: ``python -m devservers.cosmos [--host H] [--port 8081]``.

For workstation runs (e.g. next to ``func start``). Stop it with Ctrl-C. Point clients at the
printed endpoint with any key (the emulator key works) and ``enable_endpoint_discovery=False``;
create the app's database and containers with ``python -m devservers.cosmos_setup --endpoint URL``.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys

from devservers.cosmos import PACKAGE_DIR, CosmosServerError, launcher_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devservers.cosmos", description="Run the local Cosmos DB server in the foreground."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8081, help="port (default 8081, the emulator's; 0 = any free)")
    args = parser.parse_args(argv)
    try:
        command = launcher_command(args.host, args.port)
    except CosmosServerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    # Node shares the terminal: it prints `listening on ...` and its errors, and gets Ctrl-C itself.
    # Its stdin is a pipe from us, so it also exits if we die without stopping it.
    process = subprocess.Popen([*command, "--exit-on-stdin-close"], cwd=PACKAGE_DIR, stdin=subprocess.PIPE)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: process.terminate())
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        return process.wait()


if __name__ == "__main__":
    sys.exit(main())
