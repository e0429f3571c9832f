"""A dev server in a child process: start it, wait for its ``listening on <address>`` line, stop it."""

from __future__ import annotations

import argparse
import queue
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

READY_PREFIX = "listening on "


def port_number(text: str) -> int:
    """An argparse type for a server's --port: 0 (any free port) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port: give 0-65535 (0 = any free port)")
    return port


class ChildStartupError(Exception):
    """The child did not print the ready line in time; it has been stopped and its stderr file closed."""

    def __init__(self, command: Sequence[str], line: str, returncode: int, stderr: str, *, timed_out: bool) -> None:
        super().__init__(
            f"{' '.join(command)} printed {line.strip()!r} (exit status {returncode}) instead of 'listening on ...'"
        )
        #: True when the child was still running, silent, when the startup timeout ran out.
        self.timed_out = timed_out
        self.command = list(command)
        #: What the child printed instead of the ready line; "" if nothing (timeout or exit).
        self.line = line
        #: Its exit status once stopped (negative: killed by that signal, e.g. -15 after a timeout).
        self.returncode = returncode
        #: The child's stderr, stripped.
        self.stderr = stderr

    def with_stderr(self, message: str) -> str:
        """``message``, followed by the child's stderr if it wrote any."""
        return message + (f"\nstderr:\n{self.stderr}" if self.stderr else "")


def start_until_listening(
    command: Sequence[str],
    *,
    startup_timeout: float,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    stdin: int | None = None,
) -> tuple[subprocess.Popen[str], str, IO[bytes]]:
    """Start ``command``; wait up to ``startup_timeout`` seconds for its first line, ``listening on <address>``.

    Returns the process, the address and the temporary file holding its stderr (the caller closes it;
    a file, not a pipe: nobody reads it while the child runs, and a full pipe would block the child).
    Otherwise stops the child and raises ChildStartupError.
    """
    stderr = tempfile.TemporaryFile()  # noqa: SIM115 - returned to the caller, or closed below
    process = subprocess.Popen(command, stdin=stdin, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=cwd, env=env)
    lines: queue.Queue[str] = queue.Queue()
    stdout = process.stdout
    assert stdout is not None
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    timed_out = False
    try:
        line = lines.get(timeout=startup_timeout)
    except queue.Empty:
        line, timed_out = "", True
    if line.startswith(READY_PREFIX):
        return process, line[len(READY_PREFIX) :].strip(), stderr
    returncode = stop(process, 5.0)
    stderr.seek(0)
    output = stderr.read().decode(errors="replace").strip()
    stderr.close()
    raise ChildStartupError(command, line, returncode, output, timed_out=timed_out)


def stop(process: subprocess.Popen[str], timeout: float) -> int:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; close our ends of its pipes; return the exit status.

    Safe to call twice.
    """
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            stream.close()
    return process.returncode
