"""The dev servers' command lines in tests: run one as a module, on a port in use, and read its --help."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_module(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module args`` from the repository root; output captured as text, 30 s at most."""
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=30, check=False)


def run_on_taken_port(module: str, *args: str) -> tuple[int, subprocess.CompletedProcess[str]]:
    """Run the module with ``--port`` set to a loopback port something else listens on; (port, result)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        return port, run_module(module, *args, "--port", str(port))


def options_without_help(text: str) -> list[str]:
    """Option lines of argparse's help that have no text, neither beside them nor on the next line."""
    lines = text.split("\n\n", 1)[1].splitlines()  # after the usage block
    bare = []
    for number, line in enumerate(lines):
        stripped = line.strip()
        if not stripped.startswith("-"):
            continue
        beside = "  " in stripped  # argparse puts the help two or more spaces after the option
        following = lines[number + 1] if number + 1 < len(lines) else ""
        below = _indent(following) > _indent(line) and not following.strip().startswith("-")
        if not (beside or below):
            bare.append(stripped)
    return bare


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())
