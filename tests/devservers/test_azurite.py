"""Azurite from npm (``devservers.azurite``): it starts on free ports or Azure's development ones, holds blob
leases to Azure's rules where the host relies on them, and a port in use is one line."""

from __future__ import annotations

import socket
import subprocess

import pytest
from azure.core.exceptions import HttpResponseError, ResourceExistsError
from azure.storage.blob import BlobLeaseClient, BlobServiceClient

from devservers.azurite import ACCOUNT, Azurite, start_azurite
from devservers.host.singleton import ListenerLease
from tests.devservers.helptext import run_module
from tests.support.azurite import azurite  # noqa: F401 - a fixture


def test_the_connection_string_is_the_development_account_at_its_endpoints() -> None:
    defaults = Azurite(subprocess.Popen(["true"], text=True), {"Blob": "http://127.0.0.1:10000", "Queue": "http://127.0.0.1:10001",
                                                    "Table": "http://127.0.0.1:10002"})
    assert defaults.connection_string == "UseDevelopmentStorage=true"
    other = Azurite(subprocess.Popen(["true"], text=True), {"Blob": "http://127.0.0.1:5", "Queue": "http://127.0.0.1:6",
                                                 "Table": "http://127.0.0.1:7"})
    assert f"BlobEndpoint=http://127.0.0.1:5/{ACCOUNT};" in other.connection_string
    assert f"AccountName={ACCOUNT};" in other.connection_string


def test_a_lease_is_held_to_azures_rules_15_to_60_seconds_one_holder_and_a_lost_lease_is_seen_as_lost(
    azurite: Azurite,  # noqa: F811 - the fixture
) -> None:
    container = BlobServiceClient.from_connection_string(azurite.connection_string).get_container_client("rules")
    container.create_container()
    blob = container.upload_blob("locks/x", b"")
    with pytest.raises(HttpResponseError) as short:
        BlobLeaseClient(blob).acquire(lease_duration=10)
    assert short.value.status_code == 400
    first = ListenerLease(container, "app", "sweep", 15)
    second = ListenerLease(container, "app", "sweep", 15)
    assert first.acquire() and not second.acquire()
    assert first.renew() is True
    BlobLeaseClient(container.get_blob_client(first.name)).break_lease(lease_break_period=0)  # as if expired
    assert second.acquire()
    assert first.renew() is False  # another holds it: lost, as on Azure
    with pytest.raises(ResourceExistsError):
        BlobLeaseClient(container.get_blob_client(first.name)).acquire(lease_duration=15)


def test_a_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_module("devservers.azurite", "--in-memory", "--blob-port", str(port), "--queue-port", "0",
                            "--table-port", "0")
    assert result.returncode == 1 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("error: Azurite (") and "EADDRINUSE" in line and line.endswith(
        "(is a port in use? another Azurite?)"), line


def test_it_starts_on_free_ports_and_stops() -> None:
    with start_azurite() as running:
        assert set(running.endpoints) == {"Blob", "Queue", "Table"}
        BlobServiceClient.from_connection_string(running.connection_string).create_container("started")
    assert not running.running
