"""The local servers stop on a SIGTERM whichever of their threads the kernel hands it to (devservers.stopsignal).

The kernel gives a process-directed signal to whichever thread takes it first. Python runs the handler on the main
thread only, once that thread is awake: a main thread asleep in ``Event.wait()`` slept on, and a local host once
outlived its stop timeout that way. Here the signal is sent to a thread other than the main one, on purpose
(``tgkill``), which is the case the kernel may choose at any stop.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from devservers._child import start_until_listening, stop
from tests.devservers.helptext import REPO_ROOT

_LIBC = ctypes.CDLL(None, use_errno=True)


def signal_another_thread(pid: int, signum: int = signal.SIGTERM) -> int:
    """Send ``signum`` to one of the process's threads that is not its main thread; that thread's id."""
    other = next(int(tid) for tid in sorted(os.listdir(f"/proc/{pid}/task")) if int(tid) != pid)
    assert _LIBC.tgkill(pid, other, signum) == 0, os.strerror(ctypes.get_errno())
    return other


SIDE_THREAD = """
import signal, sys, threading, time
side = threading.Thread(target=time.sleep, args=(60,), daemon=True)
side.start()
{wait}
print("waiting", flush=True)
print(waited(), flush=True)
"""
WITH_STOP_SIGNALS = """
from devservers.stopsignal import StopSignals
stop = StopSignals()
def waited(timeout=None):  # None: until it comes (the test's own timeout fails a wait that never ends)
    return stop.wait(timeout) and stop.received.name
"""
WITH_AN_EVENT = """
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
def waited():
    return stop.wait(5)
"""


def thread_state(pid: int, tid: int) -> str:
    """A thread's scheduler state from /proc: ``S`` while it sleeps (in a wait), ``R`` while it runs."""
    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def run_side_thread(wait: str, signum: int = signal.SIGTERM) -> list[str]:
    """Run ``wait`` in a child whose main thread then waits; once it sleeps in that wait, send ``signum`` to the
    child's other thread; what the wait returned. Sent earlier, the handler could run on the main thread before
    its wait began, and the wait would have nothing to sleep through."""
    script = SIDE_THREAD.format(wait=textwrap.dedent(wait))
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().split() == ["waiting"]
        deadline = time.monotonic() + 20
        while thread_state(child.pid, child.pid) != "S":  # the side thread sleeps: nothing else holds the GIL
            assert time.monotonic() < deadline, "the child's main thread never began its wait"
            time.sleep(0.01)
        signal_another_thread(child.pid, signum)  # the side thread: the child has no other
        out, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0
    return out.split()


def test_a_stop_signal_taken_by_another_thread_wakes_the_main_threads_wait() -> None:
    assert run_side_thread(WITH_STOP_SIGNALS) == ["SIGTERM"]


def test_without_it_the_main_threads_event_wait_sleeps_through_a_signal_taken_by_another_thread() -> None:
    # What the module is for: the same signal, taken by another thread while the main thread sleeps in an Event's
    # wait, wakes nobody; the handler runs only once the wait has timed out.
    assert run_side_thread(WITH_AN_EVENT) == ["False"]


def test_a_signal_that_is_not_a_stop_signal_does_not_count() -> None:
    script = WITH_STOP_SIGNALS + "signal.signal(signal.SIGUSR1, lambda *_: None)\nwaited = lambda: stop.wait(1)\n"
    assert run_side_thread(script, signal.SIGUSR1) == ["False"]


@pytest.mark.parametrize("command", [
    ["-m", "devservers.servicebus", "--config", "infra/local/servicebus/Config.json", "--port", "0"],
    ["-m", "devservers.fulfilment", "--port", "0"],
    ["-m", "devservers.bank", "--port", "0"],
    ["-m", "devservers.faultproxy", "--upstream", "http://127.0.0.1:9"],
    ["-m", "devservers.azurite", "--in-memory", "--blob-port", "0", "--queue-port", "0", "--table-port", "0"],
], ids=lambda command: command[1])
def test_each_local_server_stops_on_a_sigterm_handed_to_another_of_its_threads(command: list[str]) -> None:
    process, _, log = start_until_listening([sys.executable, *command], startup_timeout=60, cwd=REPO_ROOT)
    try:
        signal_another_thread(process.pid)
        assert process.wait(15) == 0
    finally:
        stop(process, 5)
        log.close()
