"""One timer occurrence, one host process: a lock file per function and store, taken per occurrence.

On Azure a timer-triggered function is a singleton across the app's instances: "If a function app scales
out to multiple instances, only a single instance of a timer-triggered function is run across all
instances. It will not trigger again if there is an outstanding invocation still running", and "the timer
trigger uses a storage lock", a blob lease in AzureWebJobsStorage scoped by the host ID, so that apps
sharing a storage account need distinct host IDs
(https://learn.microsoft.com/azure/azure-functions/functions-bindings-timer#scale-out and
#function-apps-sharing-storage).

The local host has no blob storage. Its processes run on one machine, so the lock is a non-blocking
``fcntl.flock`` on a file in the system temp directory, named after the function and what the app's host
processes share: AzureWebJobsStorage and the host ID (``AzureFunctionsWebHost__hostid``), as on Azure; with
no host ID set, AzureWebJobsStorage and the Cosmos DB account, database and lease container of the app's
Cosmos DB triggers, where the local host keeps its change-feed leases. (Processes that reach one store
through different addresses, such as the chaos suite's hosts, each behind its own proxy, share a host ID.)
Each process, at each occurrence, tries the lock: the one that gets it writes the
occurrence's due time in the file, invokes the function, and lets go; one that finds the lock held (an
invocation is still running) or the occurrence already written skips it. A process that dies loses its
lock at once with its file descriptor, as an expired blob lease is taken over. (The real host's timer
listener is ``[Singleton(Mode = SingletonMode.Listener)]``, azure-webjobs-sdk-extensions'
``Extensions/Timers/Listeners/TimerListener.cs``: one instance holds the lease for as long as it runs the
schedule, and another takes over once the lease expires; a lock per occurrence gives each occurrence one
process without a lease to renew.)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path

from devservers.host.process import Function

LOCK_DIR_NAME = "devservers-host-timers"
_FUTURE_SLACK_SECONDS = 1.0  # a recorded occurrence further ahead than this is from a clock set back: ignored


def store_scope(settings: dict[str, str], functions: Iterable[Function]) -> list[str]:
    """What the app's host processes share, as the lock's scope: storage and the host ID, Azure's scope; with
    no host ID set, storage and the Cosmos DB lease stores (so that two stacks on one machine, each with
    its own database, keep apart)."""
    scope = [settings.get("AzureWebJobsStorage", ""), settings.get("AzureFunctionsWebHost__hostid", "")]
    if scope[1]:
        return scope
    for function in functions:
        if function.trigger_type != "cosmosDBTrigger":
            continue
        trigger = function.trigger
        connection = str(trigger.get("connection") or "CosmosDBConnection")
        text = settings.get(connection, "")
        endpoint = dict(re.findall(r"(\w+)=([^;]+)", text)).get("AccountEndpoint") if text else None
        scope.append("|".join((endpoint or settings.get(f"{connection}__accountEndpoint", ""),
                               str(trigger.get("leaseDatabaseName") or trigger.get("databaseName") or ""),
                               str(trigger.get("leaseContainerName") or "leases"))))
    return scope[:2] + sorted(set(scope[2:]))


class OccurrenceLock:
    """The lock file of one timer function in one scope (see the module docstring)."""

    def __init__(self, function_name: str, scope: list[str], directory: Path | None = None) -> None:
        digest = hashlib.sha256(json.dumps([function_name, *scope]).encode()).hexdigest()[:16]
        folder = directory or Path(tempfile.gettempdir()) / LOCK_DIR_NAME
        folder.mkdir(parents=True, exist_ok=True)
        #: The lock file; it holds the due time of the last occurrence fired.
        self.path = folder / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', function_name)}-{digest}.lock"

    @contextlib.contextmanager
    def claim(self, due: datetime | None, now: datetime) -> Iterator[bool]:
        """Whether this process fires the occurrence due at ``due``; the lock is held until the block ends.

        False when another process holds the lock (its invocation still runs) or has fired ``due`` already.
        ``due=None`` (runOnStartup) needs the lock only and records nothing.
        """
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            if due is not None:
                if self._fired(fd, due, now):
                    yield False
                    return
                os.ftruncate(fd, 0)
                os.pwrite(fd, due.isoformat().encode(), 0)
            yield True
        finally:
            os.close(fd)  # and with it the lock

    @staticmethod
    def _fired(fd: int, due: datetime, now: datetime) -> bool:
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
        try:
            last = datetime.fromisoformat(text)
        except ValueError:
            return False  # a new file, or not ours
        return due <= last and (last - now).total_seconds() <= _FUTURE_SLACK_SECONDS
