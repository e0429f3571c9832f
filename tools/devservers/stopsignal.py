"""The stop signal (SIGTERM, Ctrl-C) of a local server process that runs threads.

A Python signal handler runs on the main thread, and only once that thread is back in the interpreter. The kernel
hands a process-directed signal to whichever of its threads takes it first; when that is not the main thread, the
C-level handler runs there and a main thread asleep in a lock (``Event.wait()`` with no timeout, ``Popen.wait()``)
sleeps on. Here a local host with 32 receiving threads once did not stop within 20 s of its SIGTERM: its main thread
still in ``stop.wait()``, no ``stopping`` line. And a handler that sets an Event can deadlock when it runs while its
own thread holds that Event's lock.

So the handlers here do nothing, and the main thread waits on the signal module's wakeup socket, which the C-level
handler writes the signal's number to on whichever thread it ran.
"""

from __future__ import annotations

import signal
import socket
import time
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Waits for SIGTERM or SIGINT on the main thread, wherever the kernel delivered it. Create it on the main thread
    (the signal module's rule); it replaces those signals' handlers (so Ctrl-C raises no KeyboardInterrupt) and the
    process's wakeup fd. A signal counts from then on."""

    def __init__(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
        self._signals = {int(s) for s in signals}
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)
        self.received: signal.Signals | None = None
        for s in signals:
            signal.signal(s, _recorded_by_the_wakeup_socket)
        signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)

    def wait(self, timeout: float | None = None) -> bool:
        """Whether a stop signal has come, waiting for one ``timeout`` seconds at most (None: until it comes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.received is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            self._read.settimeout(left)
            try:
                numbers = self._read.recv(64)
            except TimeoutError:
                return False
            for number in numbers:
                if number in self._signals:
                    self.received = signal.Signals(number)
        return True


def _recorded_by_the_wakeup_socket(_signum: int, _frame: FrameType | None) -> None:
    """The Python-level handler: nothing to do, the C-level one has written the signal to the wakeup socket."""
