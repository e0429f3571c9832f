"""The workstation emulators: the Service Bus emulator's Config.json mirrors the Bicep queues within the
emulator's ranges, and docker-compose wires the services the local settings point at."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from devservers import cosmos_setup
from tests.infra.bicep import expand, main_scope

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "infra" / "local"
CONFIG = json.loads((LOCAL / "servicebus" / "Config.json").read_text())
COMPOSE = yaml.safe_load((LOCAL / "docker-compose.yml").read_text())
SAMPLE = json.loads((ROOT / "local.settings.sample.json").read_text())["Values"]

# The official emulator's allowed ranges (its documentation, as recorded in the team's platform notes).
RANGES = {
    "DefaultMessageTimeToLive": (timedelta(minutes=5), timedelta(hours=1)),
    "DuplicateDetectionHistoryTimeWindow": (timedelta(seconds=5), timedelta(minutes=5)),
    "LockDuration": (timedelta(seconds=5), timedelta(minutes=5)),
}
MAX_DELIVERY_RANGE = (1, 10)
_DURATION = re.compile(r"P(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+)S)?)?")


def duration(text: str) -> timedelta:
    match = _DURATION.fullmatch(text)
    assert match, text
    parts = {k: int(v) for k, v in match.groupdict(default="0").items()}
    return timedelta(days=parts["d"], hours=parts["h"], minutes=parts["m"], seconds=parts["s"])


def clamp(value: timedelta, bounds: tuple[timedelta, timedelta]) -> timedelta:
    return max(bounds[0], min(bounds[1], value))


def emulator_queues() -> dict[str, dict]:
    [namespace] = CONFIG["UserConfig"]["Namespaces"]
    return {q["Name"]: q["Properties"] for q in namespace["Queues"]}


def bicep_queues(**parameters: object) -> dict[str, dict]:
    module = main_scope(**parameters).module("serviceBus")
    return {copy["name"]: copy["properties"] for r in module.resources().values() if r["type"].endswith("/queues")
            for copy in expand(module, r)}


def test_emulator_declares_the_same_queues_as_bicep_in_either_events_mode() -> None:
    assert set(emulator_queues()) == set(bicep_queues()) | set(bicep_queues(eventsSessions=False))


@pytest.mark.parametrize(("queue", "events_sessions"), [("orders", True), ("order-events", True),
                                                        ("order-events-plain", False), ("order-accepted", True),
                                                        ("order-rejected", True)])
def test_emulator_queue_matches_bicep_within_the_emulator_ranges(queue: str, events_sessions: bool) -> None:
    emulator, azure = emulator_queues()[queue], bicep_queues(eventsSessions=events_sessions)[queue]
    assert emulator["RequiresDuplicateDetection"] is azure["requiresDuplicateDetection"] is True
    assert emulator["RequiresSession"] is azure["requiresSession"]
    assert emulator["DeadLetteringOnMessageExpiration"] is azure["deadLetteringOnMessageExpiration"]
    assert emulator["MaxDeliveryCount"] == min(max(azure["maxDeliveryCount"], 1), MAX_DELIVERY_RANGE[1])
    pairs = {
        "DefaultMessageTimeToLive": azure["defaultMessageTimeToLive"],
        "DuplicateDetectionHistoryTimeWindow": azure["duplicateDetectionHistoryTimeWindow"],
        "LockDuration": azure["lockDuration"],
    }
    for name, bicep_value in pairs.items():
        low, high = RANGES[name]
        assert low <= duration(emulator[name]) <= high, name
        assert duration(emulator[name]) == clamp(duration(bicep_value), RANGES[name]), name


def test_sessions_only_on_order_events() -> None:
    assert [name for name, q in emulator_queues().items() if q["RequiresSession"]] == ["order-events"]


def test_compose_runs_azurite_service_bus_with_sql_and_cosmos() -> None:
    services = COMPOSE["services"]
    images = {name: s["image"].split(":")[0] for name, s in services.items()}
    assert images["servicebus"] == "mcr.microsoft.com/azure-messaging/servicebus-emulator"
    assert images["cosmos"] == "mcr.microsoft.com/cosmosdb/linux/azure-cosmos-emulator"
    assert images["azurite"] == "mcr.microsoft.com/azure-storage/azurite"
    # The vNext emulator's tag; vnext-preview was the preview's.
    assert services["cosmos"]["image"].split(":")[1] == "vnext-latest"
    sql = services["servicebus"]["environment"]["SQL_SERVER"]
    assert images[sql] == "mcr.microsoft.com/mssql/server"
    assert (
        "./servicebus/Config.json:/ServiceBus_Emulator/ConfigFiles/Config.json:ro" in services["servicebus"]["volumes"]
    )
    assert (LOCAL / "servicebus" / "Config.json").is_file()


def published_ports(service: str) -> set[int]:
    return {int(str(p).split(":")[-2]) for p in COMPOSE["services"][service]["ports"]}


def test_compose_ports_match_the_local_settings() -> None:
    assert 5672 in published_ports("servicebus") and "UseDevelopmentEmulator=true" in SAMPLE["ServiceBusConnection"]
    port = re.search(r":(\d+)", SAMPLE["COSMOS_ENDPOINT"].split("//")[1])
    assert port, SAMPLE["COSMOS_ENDPOINT"]
    cosmos_port = int(port.group(1))
    assert cosmos_port in published_ports("cosmos")
    assert COMPOSE["services"]["cosmos"]["environment"]["PROTOCOL"] == "http"
    assert SAMPLE["COSMOS_ENDPOINT"].startswith("http://")
    assert {10000, 10001, 10002} <= published_ports("azurite")
    assert SAMPLE["AzureWebJobsStorage"] == "UseDevelopmentStorage=true"


def test_compose_publishes_on_loopback_only_and_holds_no_password() -> None:
    for name, service in COMPOSE["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
    text = (LOCAL / "docker-compose.yml").read_text()
    assert "${MSSQL_SA_PASSWORD:?" in text


def test_the_emulators_containers_are_made_by_the_setup_that_applies_the_bicep_policy() -> None:
    # The Linux emulator gets its database and containers from devservers.cosmos_setup, as make run does,
    # so both take the orders container's indexing policy from the file cosmos.bicep loads.
    text = (LOCAL / "docker-compose.yml").read_text()
    assert "python -m devservers.cosmos_setup --endpoint http://127.0.0.1:8081" in text
    orders = cosmos_setup.container_specs()[0]
    assert orders.indexing_policy == json.loads(cosmos_setup.ORDERS_INDEXING_POLICY.read_text())
    assert cosmos_setup.ORDERS_INDEXING_POLICY == ROOT / "infra" / "orders-indexing-policy.json"
