"""Run Azurite in the foreground: ``python -m devservers.azurite [--host H] [--location DIR] [--in-memory]``.

On the ports ``UseDevelopmentStorage=true`` points at (Blob 10000, Queue 10001, Table 10002) unless told
otherwise; data in ``--location`` (default ``.azurite`` under the project root, so that timers' schedule
status outlives a restart, as a storage account does). Prints ``listening on <blob endpoint>`` once the three
services listen; stop it with Ctrl-C. Errors are one line on stderr with exit status 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from devservers._child import port_number
from devservers.azurite import DEFAULT_PORTS, AzuriteError, start_azurite
from devservers.stopsignal import StopSignals

ROOT = Path(__file__).resolve().parents[3]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devservers.azurite", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    for service, port in DEFAULT_PORTS.items():
        parser.add_argument(f"--{service.lower()}-port", type=port_number, default=port,
                            help=f"{service} port (default {port}; 0 = any free)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--location", type=Path, default=ROOT / ".azurite", help="data folder (default .azurite)")
    where.add_argument("--in-memory", action="store_true", help="keep the data in memory only")
    args = parser.parse_args(argv)
    ports = {service: getattr(args, f"{service.lower()}_port") for service in DEFAULT_PORTS}
    if not args.in_memory:
        args.location.mkdir(parents=True, exist_ok=True)
    try:
        azurite = start_azurite(args.host, ports, location=None if args.in_memory else args.location)
    except AzuriteError as err:
        print(f"error: {err} (is a port in use? another Azurite?)", file=sys.stderr)
        return 1
    stop = StopSignals()  # the thread that drains Azurite's output may be the one handed the signal
    print(f"listening on {azurite.endpoints['Blob']}", flush=True)
    print(f"AzureWebJobsStorage={azurite.connection_string}", file=sys.stderr, flush=True)
    while azurite.running:
        if stop.wait(0.5):
            azurite.stop()
            return 0
    return azurite.wait()


if __name__ == "__main__":
    sys.exit(main())
