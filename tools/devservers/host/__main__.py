"""Run a Functions app on the local host: ``python -m devservers.host [--app-dir .] [--settings FILE]``.

Prints ``listening on HOST:PORT`` on stdout once the worker has indexed the app and every trigger is
listening; logs (one line per invocation, the worker's logs) go to stderr. SIGTERM or Ctrl-C stops
receiving, lets in-flight invocations finish, stops the worker and exits 0. An app that cannot be
indexed, or a missing connection setting, is one line on stderr and exit 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from devservers.host.core import Host, HostConfig
from devservers.host.process import HostError
from devservers.stopsignal import StopSignals


def main(argv: list[str] | None = None) -> int:
    """Start the host, serve until a signal, stop cleanly."""
    parser = argparse.ArgumentParser(prog="python -m devservers.host", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--app-dir", type=Path, default=Path(), help="the Functions app (default: .)")
    parser.add_argument("--settings", type=Path, default=None,
                        help="local.settings.json whose Values are the app settings (default: APP_DIR's, if any)")
    parser.add_argument("--verbose", action="store_true", help="also the SDKs' own logs")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("azure", "uamqp", "grpc"):
        logging.getLogger(noisy).setLevel(logging.INFO if args.verbose else logging.WARNING)
    app_dir = args.app_dir.resolve()
    settings = args.settings or (app_dir / "local.settings.json")
    stop = StopSignals()  # any of the host's threads may be handed the signal; a signal while it starts counts
    try:
        host = Host(HostConfig.load(app_dir, settings if settings.is_file() or args.settings else None))
        host.start()
    except HostError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"listening on {host.address[0]}:{host.address[1]}", flush=True)
    stop.wait()
    logging.getLogger("devservers.host").info("stopping: no new messages; waiting for invocations in flight")
    host.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
