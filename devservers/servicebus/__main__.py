"""Run the test broker: ``python -m devservers.servicebus --config PATH [--host 127.0.0.1] [--port N]``.

Prints exactly one line to stdout, ``listening on HOST:PORT``, once it accepts connections, then
serves until SIGTERM or SIGINT and exits 0. Logs go to stderr (``--verbose`` for more). A bad
config exits 2 with the reason on stderr.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType

from devservers.servicebus import READY_PREFIX, Broker, ConfigError
from devservers.servicebus.config import load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devservers.servicebus",
        description="Local AMQP test broker for the azure-servicebus SDK (Service Bus emulator Config.json).",
    )
    parser.add_argument("--config", required=True, help="path to the emulator's Config.json")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=5672, help="port (default 5672, the emulator's; 0 = any free)")
    parser.add_argument("--verbose", action="store_true", help="log every refused link and failed operation")
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # proton logs every client that hangs up without waiting for our close frame ("Couldn't send").
    logging.getLogger("proton").setLevel(logging.INFO if args.verbose else logging.CRITICAL)
    try:
        config = load_config(args.config)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        broker = Broker(config, args.host, args.port)
    except OSError as err:
        print(f"error: cannot listen on {args.host}:{args.port}: {err.strerror or err}", file=sys.stderr)
        return 1
    stop = threading.Event()

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    broker.start()
    print(f"{READY_PREFIX}{broker.host}:{broker.port}", flush=True)
    while not stop.wait(0.5):
        if not broker.running:
            print("error: the broker stopped unexpectedly", file=sys.stderr)
            return 1
    broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
