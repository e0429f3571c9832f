"""Run the test broker: ``python -m devservers.servicebus --config PATH [--host 127.0.0.1] [--port N] [--verbose]``.

Prints exactly one line to stdout, ``listening on HOST:PORT``, once it accepts connections, then
serves until SIGTERM or SIGINT and exits 0. Logs go to stderr; ``--verbose`` adds one line per
request (attach, send, deliver, settle, $management, $cbs: the entity and the outcome, never a
payload). Errors are one line on stderr: an invalid config exits 2, a port in use or another failure
to listen exits 1.
"""

from __future__ import annotations

import argparse
import errno
import logging
import sys
from pathlib import Path

from devservers._child import port_number
from devservers.servicebus import READY_PREFIX, Broker, ConfigError
from devservers.servicebus.config import NamespaceConfig, load_config
from devservers.stopsignal import StopSignals


def _parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="python -m devservers.servicebus",
        description="Local AMQP test broker for the azure-servicebus SDK (Service Bus emulator Config.json).",
        epilog="example:\n  python -m devservers.servicebus --config infra/local/servicebus/Config.json --port 5672 "
               "--verbose\n\nexit status: 0 stopped by SIGTERM or SIGINT; 1 cannot listen (e.g. the port is in "
               "use); 2 bad usage or an invalid config",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    parser.add_argument("--config", required=True, help="path to the emulator's Config.json")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=5672,
                        help="port (default 5672, the emulator's; 0 = any free)")
    parser.add_argument("--verbose", action="store_true",
                        help="log one line per request (operation, entity, outcome; no payloads), every refused "
                             "link and every failed operation")
    args = parser.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # proton logs every client that hangs up without waiting for our close frame ("Couldn't send").
    logging.getLogger("proton").setLevel(logging.INFO if args.verbose else logging.CRITICAL)
    try:
        config = _config(args.config)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        broker = Broker(config, args.host, args.port)
    except OSError as err:
        print(f"error: {_cannot_listen(args.host, args.port, err)}", file=sys.stderr)
        return 1
    stop = StopSignals()
    broker.start()
    print(f"{READY_PREFIX}{broker.host}:{broker.port}", flush=True)
    while not stop.wait(0.5):
        if not broker.running:
            print("error: the broker stopped unexpectedly", file=sys.stderr)
            return 1
    broker.stop()
    return 0


def _config(path: str) -> NamespaceConfig:
    """The config; a file that is not UTF-8 is a ConfigError naming the line, like every other config error."""
    try:
        return load_config(path)
    except UnicodeDecodeError as err:
        data = Path(path).read_bytes()
        line = data.count(b"\n", 0, err.start) + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 (byte 0x{data[err.start]:02x}); save it as UTF-8") from None


def _cannot_listen(host: str, port: int, err: OSError) -> str:
    if err.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is in use (another broker, or the Service Bus emulator?); stop that, or "
                "choose another --port (0 = any free)")
    if err.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {host}:{port}: {host} is not an address of this machine"
    return f"cannot listen on {host}:{port}: {err.strerror or err}"


if __name__ == "__main__":
    sys.exit(main())
