"""Run the local Cosmos server in the foreground: ``python -m devservers.cosmos [--host H] [--port 8081] [--verbose]``.

For workstation runs (e.g. next to ``func start``). Stop it with Ctrl-C. Point clients at the
printed endpoint with any key (the emulator key works) and ``enable_endpoint_discovery=False``;
create the app's database and containers with ``python -m devservers.cosmos_setup --endpoint URL``.
``--verbose`` logs one line per request on stderr (operation, method, path, status; never a body).
Errors are one line on stderr with exit status 1 (Node or the package missing, the port in use).
"""

from __future__ import annotations

import argparse
import errno
import signal
import socket
import subprocess
import sys

from devservers._child import port_number
from devservers.cosmos import PACKAGE_DIR, CosmosServerError, launcher_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devservers.cosmos", description="Run the local Cosmos DB server in the foreground.",
        epilog="example:\n  python -m devservers.cosmos --port 8081 --verbose\n\nexit status: 0 stopped by "
               "Ctrl-C or SIGTERM; 1 cannot start (Node or the package missing, the port in use); 2 bad usage",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=8081,
                        help="port (default 8081, the emulator's; 0 = any free)")
    parser.add_argument("--verbose", action="store_true",
                        help="log one line per request on stderr (operation, method, path, status; no bodies)")
    args = parser.parse_args(argv)
    try:
        command = launcher_command(args.host, args.port, verbose=args.verbose)
    except CosmosServerError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.port and _in_use(args.host, args.port):
        print(f"error: port {args.port} on {args.host} is in use (another Cosmos server, or the emulator?); stop "
              "that, or choose another --port (0 = any free)", file=sys.stderr)
        return 1
    # Node shares the terminal: it prints `listening on ...` and its errors, and gets Ctrl-C itself.
    # Its stdin is a pipe from us, so it also exits if we die without stopping it.
    process = subprocess.Popen([*command, "--exit-on-stdin-close"], cwd=PACKAGE_DIR, stdin=subprocess.PIPE)
    # One thread, so the kernel hands the signal to it and the handler runs (devservers.stopsignal is for the others).
    signal.signal(signal.SIGTERM, lambda _signum, _frame: process.terminate())
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        return process.wait()


def _in_use(host: str, port: int) -> bool:
    """True if something listens on the port already (checked as Node binds: with SO_REUSEADDR)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError:
        return False  # Node reports a host it cannot resolve
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as err:
            return err.errno == errno.EADDRINUSE
    return False


if __name__ == "__main__":
    sys.exit(main())
