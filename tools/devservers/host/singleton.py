"""What the Functions host keeps of its timers in ``AzureWebJobsStorage``: the listener lease and the schedule status.

On Azure a timer function is a singleton across the app's instances, by a blob lease: the timer's listener is
``[Singleton(Mode = SingletonMode.Listener)]`` (azure-webjobs-sdk-extensions ``TimerListener``), and the
WebJobs SDK's ``SingletonListener`` starts it only in the instance that holds the lease on
``azure-webjobs-hosts/locks/{hostId}/Host.Functions.{name}.Listener`` (``BlobLeaseDistributedLockManager``).
The lease lasts ``singleton.listenerLockPeriod`` (60 s; 15 to 60 s) and is renewed every half period; an
instance that does not get it at start tries again every ``singleton.listenerLockRecoveryPollingInterval``
(60 s; 15 s at least). A stopped instance releases it; a dead one's expires, and another takes it at its next
try. Each start of the listener, a takeover's too, checks the schedule status at
``azure-webjobs-hosts/timers/{hostId}/Host.Functions.{name}/status`` (``StorageScheduleMonitor``): an
occurrence missed while no instance listened fires at once as past due, and each invocation writes the status
after it. The local host does the same against Azurite (``devservers.azurite``) or any storage account.

The host ID is ``AzureFunctionsWebHost__hostid`` when set; otherwise what the host computes outside Azure, as
under Core Tools: the machine name's letters and digits, ``-``, and a stable hash of the app's path, lowercased
and cut to 32 characters (azure-functions-host ``ScriptHostIdProvider``). Apps that share a storage account
need distinct host IDs, as on Azure.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.storage.blob import BlobClient, BlobLeaseClient, BlobServiceClient, ContainerClient

from devservers.host.process import HostError

logger = logging.getLogger("devservers.host")
HOST_CONTAINER = "azure-webjobs-hosts"
MAX_HOST_ID_LENGTH = 32
#: DateTime's default, which a status holds for "never".
NEVER = datetime(1, 1, 1, tzinfo=UTC)


def host_id(settings: dict[str, str], app_dir: Path) -> str:
    """The host ID: the setting, or what the host computes outside Azure (module docstring)."""
    chosen = settings.get("AzureFunctionsWebHost__hostid", "").strip()
    if not chosen:
        machine = re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())
        chosen = f"{machine}-{abs(stable_hash(str(app_dir.resolve())))}"
    return chosen.lower()[:MAX_HOST_ID_LENGTH].rstrip("-")


def stable_hash(text: str) -> int:
    """azure-functions-host's ``Utility.GetStableHash``: 23, then h * 31 + c per UTF-16 unit, in 32-bit ints."""
    value = 23
    data = text.encode("utf-16-le")
    for index in range(0, len(data), 2):
        value = (value * 31 + int.from_bytes(data[index:index + 2], "little")) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def host_container(settings: dict[str, str]) -> ContainerClient:
    """``azure-webjobs-hosts`` in the ``AzureWebJobsStorage`` account: a connection string (Azurite's
    ``UseDevelopmentStorage=true`` included), or an identity-based connection (``__blobServiceUri`` or
    ``__accountName``) with ``DefaultAzureCredential``, as the host resolves it."""
    if connection_string := settings.get("AzureWebJobsStorage", "").strip():
        return BlobServiceClient.from_connection_string(connection_string).get_container_client(HOST_CONTAINER)
    account = settings.get("AzureWebJobsStorage__accountName", "").strip()
    uri = settings.get("AzureWebJobsStorage__blobServiceUri", "").strip() or (
        f"https://{account}.blob.core.windows.net" if account else "")
    if not uri:
        raise HostError("timer functions need AzureWebJobsStorage (UseDevelopmentStorage=true for Azurite, started by "
                        "make run), or AzureWebJobsStorage__accountName / __blobServiceUri")
    from azure.identity import DefaultAzureCredential  # noqa: PLC0415 - only for identity connections

    return BlobServiceClient(uri, DefaultAzureCredential()).get_container_client(HOST_CONTAINER)


def transient(error: AzureError) -> bool:
    """Whether a storage call failed in a way worth trying again soon: the transport, or a 408, 429 or 5xx."""
    if isinstance(error, ServiceRequestError | ServiceResponseError):
        return True
    status = error.status_code if isinstance(error, HttpResponseError) else None
    return status is None or status in (408, 429) or status >= 500


class ListenerLease:
    """The blob lease that makes this host process the timer function's listener (``SingletonListener``)."""

    def __init__(self, container: ContainerClient, host: str, function_name: str, period: float) -> None:
        self._container = container
        #: ``locks/{hostId}/Host.Functions.{name}.Listener``, as the host names it.
        self.name = f"locks/{host}/Host.Functions.{function_name}.Listener"
        self.period = period
        self._blob: BlobClient = container.get_blob_client(self.name)
        self._lease = BlobLeaseClient(self._blob, lease_id=str(uuid.uuid4()))

    def acquire(self) -> bool:
        """Take the lease if nobody holds it (creating the container and the empty blob first if need be).

        False when another instance holds it; raises AzureError when storage cannot be reached.
        """
        try:
            state = self._blob.get_blob_properties().lease.state
        except ResourceNotFoundError:
            with contextlib.suppress(ResourceExistsError):
                self._container.create_container()
            with contextlib.suppress(ResourceExistsError, HttpResponseError):
                self._blob.upload_blob(b"", overwrite=False)
            state = None
        if state not in (None, "available", "expired", "broken"):
            return False
        try:
            self._lease.acquire(lease_duration=int(self.period))
        except ResourceExistsError:
            return False  # another instance took it first
        except HttpResponseError as error:
            if error.status_code == 409:
                return False
            raise
        return True

    def renew(self) -> bool | None:
        """Renew the lease: True when renewed, False when it is lost (another instance holds it, or the blob
        is gone), None when storage did not answer (try again soon)."""
        try:
            self._lease.renew()
        except AzureError as error:
            if transient(error):
                logger.warning("%s: renewing the lease failed for now (%s)", self.name, type(error).__name__)
                return None
            logger.error("%s: the lease is lost (%s)", self.name, type(error).__name__)
            return False
        return True

    def release(self) -> None:
        """Let the lease go; one that is lost or gone already is no error."""
        with contextlib.suppress(AzureError):
            self._lease.release()


@dataclass(frozen=True)
class ScheduleStatus:
    """The schedule monitor's status of one timer: the last occurrence run, the next expected, when updated."""

    last: datetime
    next: datetime
    last_updated: datetime

    def to_json(self) -> dict[str, str]:
        """The status as the host writes it (Newtonsoft's ISO dates, UTC)."""
        return {"Last": _iso(self.last), "Next": _iso(self.next), "LastUpdated": _iso(self.last_updated)}

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> ScheduleStatus:
        """A status the host (or this host) wrote."""
        return cls(_parse(document["Last"]), _parse(document["Next"]), _parse(document["LastUpdated"]))


class ScheduleMonitor:
    """The timer's status blob, ``timers/{hostId}/Host.Functions.{name}/status`` (``StorageScheduleMonitor``)."""

    def __init__(self, container: ContainerClient, host: str, function_name: str) -> None:
        self._container = container
        self.name = f"timers/{host}/Host.Functions.{function_name}/status"
        self._blob = container.get_blob_client(self.name)

    def status(self) -> ScheduleStatus | None:
        """The stored status; None when none was written yet."""
        try:
            return ScheduleStatus.from_json(json.loads(self._blob.download_blob().readall()))
        except ResourceNotFoundError:
            return None

    def update(self, status: ScheduleStatus) -> None:
        """Write the status; best effort, as the host's (an error is logged, not raised)."""
        body = json.dumps(status.to_json()).encode()
        try:
            try:
                self._blob.upload_blob(body, overwrite=True)
            except ResourceNotFoundError:
                with contextlib.suppress(ResourceExistsError):
                    self._container.create_container()
                self._blob.upload_blob(body, overwrite=True)
        except AzureError as error:
            logger.error("%s: the timer's status was not updated (%s)", self.name, type(error).__name__)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


def _parse(text: str) -> datetime:
    """An ISO date as Newtonsoft writes it (up to 7 fraction digits; no offset means UTC here)."""
    trimmed = re.sub(r"(\.\d{6})\d+", r"\1", text.strip()).replace("Z", "+00:00")
    moment = datetime.fromisoformat(trimmed)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
