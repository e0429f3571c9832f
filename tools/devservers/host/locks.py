"""Lock renewal as the Functions host's Service Bus processor does it (Azure.Messaging.ServiceBus ReceiverManager).

A message's renewal starts just before its function runs and stops when the function returns (after the
host's own settlement); a session's starts when the session is accepted and stops when the slot lets it go.
Either way renewal stops once ``maxAutoLockRenewalDuration`` has passed since that start, counted once (a
session's from its acceptance, not per message), and ``0`` renews nothing. Each renewal comes when
min(half the time left, 10 s) is left, at once under 400 ms (``CalculateRenewDelay``), so a lock is held at
least until start + maxAutoLockRenewalDuration: a 5 s lock is renewed 2.5 s before it ends.

The SDK's ``AutoLockRenewer`` does not match that, so the host does not use it: it has no way to stop a
message's renewal when the function returns (a message left unsettled stayed locked for the whole
maxAutoLockRenewalDuration, 5 minutes by default, not for its LockDuration); it looks every 0.5 s; and under
a 10.5 s lock it renews at 0.75 x the whole seconds left when the message was registered, fixed then (0.75 s
before expiry for a message registered with 1.9 s left).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from azure.servicebus.exceptions import (
    OperationTimeoutError,
    ServiceBusCommunicationError,
    ServiceBusConnectionError,
    ServiceBusServerBusyError,
)

logger = logging.getLogger("devservers.host")
# Azure.Messaging.ServiceBus Constants.MaximumRenewBufferDuration, and CalculateRenewDelay's "renew at once".
MAX_RENEW_BUFFER_SECONDS = 10.0
RENEW_AT_ONCE_SECONDS = 0.4
# .NET renews again after a transient failure; the Python call has retried by itself (retry_total) first.
TRANSIENT = (OperationTimeoutError, ServiceBusCommunicationError, ServiceBusConnectionError, ServiceBusServerBusyError)
RETRY_WAIT_SECONDS = 0.5


def renew_delay(remaining: float) -> float:
    """How long to wait before renewing a lock with ``remaining`` seconds left, as ``CalculateRenewDelay``."""
    if remaining < RENEW_AT_ONCE_SECONDS:
        return 0.0
    return remaining - min(remaining / 2, MAX_RENEW_BUFFER_SECONDS)


class LockRenewal:
    """Renews one lock on a thread of its own, from ``start()`` until ``duration`` seconds later or ``stop()``.

    ``renew`` renews the lock (the SDK's ``renew_message_lock`` or a session's ``renew_lock``), and
    ``locked_until`` says when it ends now; None once the message is settled, which ends the renewal.
    """

    def __init__(self, what: str, renew: Callable[[], object], locked_until: Callable[[], datetime | None],
                 duration: float) -> None:
        self.what = what
        self._renew = renew
        self._locked_until = locked_until
        self._duration = duration
        self._deadline = 0.0  # time.monotonic() at which renewal stops, set by start()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"renew {what}", daemon=True)

    def start(self) -> LockRenewal:
        """Start renewing now; with a duration of 0, nothing is renewed (as ``AutoRenewLock`` is then off)."""
        if self._duration > 0:
            self._deadline = time.monotonic() + self._duration
            self._thread.start()
        return self

    def stop(self) -> None:
        """Renew no more; a renewal under way finishes on its own thread."""
        self._stopped.set()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the renewal's thread to end (for tests)."""
        if self._thread.ident is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while (until := self._locked_until()) is not None:  # None: settled, no lock left to renew
            wait = renew_delay((until - datetime.now(UTC)).total_seconds())
            if self._stopped.wait(min(wait, self._deadline - time.monotonic())) or time.monotonic() >= self._deadline:
                return
            if self._locked_until() is None:
                return  # settled while this waited
            try:
                self._renew()
            except TRANSIENT as exc:
                self._failed(exc, "trying again")
                if self._stopped.wait(RETRY_WAIT_SECONDS):
                    return
            except Exception as exc:  # lock lost, message settled, receiver closed: .NET stops renewing too
                self._failed(exc, "renewal stops")
                return

    def _failed(self, exc: Exception, then: str) -> None:
        if not self._stopped.is_set():  # a receiver closed under a stopped renewal is no news
            logger.warning("renewing the lock of %s failed (%s: %s); %s", self.what, type(exc).__name__,
                           str(exc)[:200], then)
