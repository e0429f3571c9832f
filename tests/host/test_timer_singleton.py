"""Two local hosts of one app with one timer, against Azurite, as two instances on Azure: the one that holds the
listener's blob lease fires each occurrence, and once it dies its lease expires within the lease's period
(host.json's singleton.listenerLockPeriod, 15 s here) and the other takes the timer at its next try
(listenerLockRecoveryPollingInterval, 15 s here)."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from azure.storage.blob import BlobServiceClient

from devservers.azurite import Azurite
from devservers.host.singleton import HOST_CONTAINER
from tests.host.conftest import NEEDS_313, HostProcess, eventually

TIMER_APP = Path(__file__).resolve().parent / "timer_app"
PERIOD, RECOVERY = 15, 15


def dues(host: HostProcess) -> list[str]:
    return re.findall(r"tick timer outcome=Succeeded \d+ ms due=(\S+)", host.output())


@NEEDS_313
def test_two_hosts_fire_the_timer_once_each_second_and_a_killed_holders_timer_goes_to_the_other(
    azurite: Azurite, start_host: Callable[..., HostProcess]
) -> None:
    app = f"timers-{uuid.uuid4().hex[:12]}"
    values = {"FUNCTIONS_WORKER_RUNTIME": "python", "AzureWebJobsStorage": azurite.connection_string,
              "AzureFunctionsWebHost__hostid": app}
    hosts = [start_host(TIMER_APP, values) for _ in range(2)]
    eventually(lambda: sum(len(dues(h)) for h in hosts) >= 4, timeout=30, what="four occurrences fired")
    [holder] = [h for h in hosts if dues(h)]
    [other] = [h for h in hosts if h is not holder]
    assert dues(other) == []

    blob = BlobServiceClient.from_connection_string(azurite.connection_string).get_container_client(
        HOST_CONTAINER).get_blob_client(f"locks/{app}/Host.Functions.tick.Listener")
    assert blob.get_blob_properties().lease.state == "leased"
    holder.kill()  # SIGKILL: nothing is released
    killed = time.monotonic()
    eventually(lambda: blob.get_blob_properties().lease.state != "leased", timeout=PERIOD + 2,
               what="the dead holder's lease expiring")
    assert time.monotonic() - killed <= PERIOD + 1
    eventually(lambda: dues(other), timeout=PERIOD + RECOVERY + 5, what="the other host firing the timer")
    assert time.monotonic() - killed <= PERIOD + RECOVERY + 5
    eventually(lambda: len(dues(other)) >= 2, timeout=5, what="the other host firing each second")
    fired = dues(holder) + dues(other)
    assert len(fired) == len(set(fired)), sorted(fired)  # no occurrence fired twice
