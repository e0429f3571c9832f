"""python -m deps lock | check [--offline]: make the lock of the deployed dependencies, or check it."""

from __future__ import annotations

import argparse
import subprocess
import sys

from deps import LOCK, RANGES, ROOT, compile_command, findings, resolved_again


def main(argv: list[str] | None = None) -> int:
    """Run the command; 0 when done or agreed, 1 when the lock disagrees, 2 when a step could not run."""
    parser = argparse.ArgumentParser(prog="python -m deps", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("lock", help="write requirements.txt from requirements.in (keeps the pins still in range)")
    check = commands.add_parser("check", help="fail when requirements.txt is not the lock of requirements.in")
    check.add_argument("--offline", action="store_true", help="skip resolving again (which needs the package index)")
    args = parser.parse_args(argv)
    try:
        if args.command == "lock":
            subprocess.run(compile_command(LOCK), check=True, cwd=ROOT,  # noqa: S603 (our own command)
                           capture_output=True, text=True, timeout=300)
            print(f"deps: wrote {LOCK.name} from {RANGES.name}")
            return 0
        disagreements = findings(RANGES.read_text(), LOCK.read_text())
        if not disagreements and not args.offline and resolved_again() != LOCK.read_text():
            disagreements = [f"uv resolves {RANGES.name} to another lock than {LOCK.name}"]
    except subprocess.CalledProcessError as error:
        last = (error.stderr or "").strip().splitlines()[-1:] or ["no output"]
        print(f"deps: uv could not resolve {RANGES.name} (is the package index reachable?): {last[0]}",
              file=sys.stderr)
        return 2
    except (OSError, ValueError, subprocess.TimeoutExpired) as error:
        print(f"deps: {error}", file=sys.stderr)
        return 2
    for line in disagreements:
        print(f"deps: {line}", file=sys.stderr)
    if disagreements:
        print(f"deps: {LOCK.name} is stale; run `make lock` and commit both files", file=sys.stderr)
        return 1
    print(f"deps: {LOCK.name} is the lock of {RANGES.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
