"""Static checks of infra/*.bicep, parsed with pycep-parser: the settings idempotency depends on."""

from __future__ import annotations

import pytest

from shared.settings import Settings
from tests.infra.bicep import INFRA, Scope, Unresolved, bicep_files, expand, main_scope, parse, role_guid

SERVICE_BUS_DATA_RECEIVER = "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0"
SERVICE_BUS_DATA_SENDER = "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39"
SERVICE_BUS_DATA_OWNER = "090c5cfd-751d-490a-894a-3ce6f1109419"
COSMOS_DATA_CONTRIBUTOR = "00000000-0000-0000-0000-000000000002"
STORAGE_BLOB_DATA_OWNER = "b7e6dc6d-f1e8-4753-8033-0f276bb0955b"
STORAGE_TABLE_DATA_CONTRIBUTOR = "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3"
STORAGE_QUEUE_DATA_CONTRIBUTOR = "974c5e8b-45b9-4653-ba55-5f855dd0fb88"
OPERATOR = "11111111-2222-3333-4444-555555555555"


@pytest.fixture(scope="module")
def main() -> Scope:
    return main_scope()


def resources(scope: Scope) -> dict[str, dict]:
    return scope.resources()


def test_every_bicep_file_parses() -> None:
    files = bicep_files()
    assert "main.bicep" in files and len(files) >= 7
    for relative in files:
        assert parse(relative)["resources"] or parse(relative).get("modules"), relative


def test_main_targets_the_subscription_and_creates_a_resource_group(main: Scope) -> None:
    assert parse("main.bicep")["globals"]["scope"]["value"] == "subscription"
    [group] = [r for r in resources(main).values() if r["type"] == "Microsoft.Resources/resourceGroups"]
    assert group["config"]["name"] == "rg-dev"
    assert set(parse("main.bicep")["modules"]) == {
        "monitoring",
        "storage",
        "serviceBus",
        "cosmos",
        "functionApp",
        "network",
        "roles",
        "alerts",
        "workbook",
    }


def test_names_derive_from_one_resource_token() -> None:
    text = (INFRA / "main.bicep").read_text()
    assert text.count("uniqueString(") == 1
    for relative in bicep_files():
        if relative.startswith("modules/"):
            for resource in parse(relative)["resources"].values():
                name = resource["config"].get("name") if isinstance(resource["config"], dict) else None
                if isinstance(name, str) and "${" in name and not resource["existing"]:
                    assert "${resourceToken}" in name, (relative, name)


def test_service_bus_tier_has_duplicate_detection_and_basic_is_not_allowed(main: Scope) -> None:
    allowed = [d for d in parse("main.bicep")["parameters"]["serviceBusSku"]["decorators"] if d["type"] == "allowed"]
    assert allowed[0]["argument"] == ["Standard", "Premium"]
    namespace = resources(main.module("serviceBus"))["namespace"]["config"]
    assert namespace["sku"]["name"] == "Standard"
    assert namespace["properties"]["disableLocalAuth"] is True
    assert namespace["properties"]["minimumTlsVersion"] == "1.2"


@pytest.mark.parametrize(("queue", "sessions"), [("ordersQueue", False), ("eventsQueue", True),
                                                 ("outboxQueues", False)])
def test_queues_have_duplicate_detection_and_dead_lettering(main: Scope, queue: str, sessions: bool) -> None:
    service_bus = main.module("serviceBus")
    [properties, *more] = [copy["properties"] for copy in expand(service_bus, resources(service_bus)[queue])]
    assert all(other == properties for other in more)  # the outbox's two destinations alike
    assert properties["requiresDuplicateDetection"] is True
    assert properties["duplicateDetectionHistoryTimeWindow"] == "PT10M"
    assert properties["lockDuration"] == "PT60S"
    assert properties["maxDeliveryCount"] == 10
    assert properties["deadLetteringOnMessageExpiration"] is True
    assert properties["defaultMessageTimeToLive"] == "PT86400S"
    assert properties["requiresSession"] is sessions


def test_queue_names_match_the_app_defaults(main: Scope) -> None:
    service_bus = main.module("serviceBus")
    names = {copy["name"] for r in resources(service_bus).values() if r["type"].endswith("/queues")
             for copy in expand(service_bus, r)}
    assert names == {"orders", "order-events", "order-accepted", "order-rejected"}
    settings = Settings()
    assert {settings.outbox_destination, settings.outbox_rejected_destination} == {"order-accepted", "order-rejected"}


def test_cosmos_is_entra_only_with_session_consistency(main: Scope) -> None:
    account = resources(main.module("cosmos"))["account"]["config"]["properties"]
    assert account["disableLocalAuth"] is True
    assert account["consistencyPolicy"]["defaultConsistencyLevel"] == "Session"
    assert account["minimalTlsVersion"] == "Tls12"
    assert account["capabilities"] == [{"name": "EnableServerless"}]


def test_containers_partition_keys_and_ttl(main: Scope) -> None:
    cosmos = resources(main.module("cosmos"))
    orders = cosmos["orders"]["config"]["properties"]["resource"]
    leases = cosmos["leases"]["config"]["properties"]["resource"]
    assert (orders["id"], orders["partitionKey"]["paths"], orders["defaultTtl"]) == ("orders", ["/orderId"], -1)
    assert (leases["id"], leases["partitionKey"]["paths"]) == ("leases", ["/id"])
    assert cosmos["database"]["config"]["name"] == "sales"


def test_capacity_mode_is_a_parameter() -> None:
    allowed = [
        d for d in parse("main.bicep")["parameters"]["cosmosCapacityMode"]["decorators"] if d["type"] == "allowed"
    ]
    assert allowed[0]["argument"] == ["serverless", "autoscale"]
    autoscale = resources(main_scope(cosmosCapacityMode="autoscale").module("cosmos"))
    assert autoscale["account"]["config"]["properties"]["capabilities"] == []
    assert autoscale["database"]["config"]["properties"]["options"] == {"autoscaleSettings": {"maxThroughput": 1000}}
    serverless = resources(main_scope().module("cosmos"))
    assert serverless["database"]["config"]["properties"]["options"] == {}


def test_storage_forbids_shared_keys_and_old_tls(main: Scope) -> None:
    properties = resources(main.module("storage"))["account"]["config"]["properties"]
    assert properties["allowSharedKeyAccess"] is False
    assert properties["allowBlobPublicAccess"] is False
    assert properties["minimumTlsVersion"] == "TLS1_2"
    assert properties["supportsHttpsTrafficOnly"] is True


def test_function_app_is_flex_consumption_python_with_managed_identity(main: Scope) -> None:
    app = resources(main.module("functionApp"))
    assert app["plan"]["config"]["sku"] == {"tier": "FlexConsumption", "name": "FC1"}
    site = app["site"]["config"]
    assert site["identity"]["type"] == "SystemAssigned"
    assert site["properties"]["functionAppConfig"]["runtime"] == {"name": "python", "version": "3.13"}
    assert site["properties"]["functionAppConfig"]["deployment"]["storage"]["authentication"]["type"] == (
        "SystemAssignedIdentity"
    )
    assert site["properties"]["httpsOnly"] is True
    assert site["properties"]["siteConfig"]["minTlsVersion"] == "1.2"


def test_application_insights_uses_a_workspace_and_entra_ingestion(main: Scope) -> None:
    monitoring = resources(main.module("monitoring"))
    assert monitoring["workspace"]["type"] == "Microsoft.OperationalInsights/workspaces"
    assert monitoring["applicationInsights"]["config"]["properties"]["DisableLocalAuth"] is True


def test_data_owner_only_on_the_two_input_queues_for_the_trigger_and_its_target_based_scaling(main: Scope) -> None:
    roles = main.module("roles")
    found = resources(roles)
    receiver = found["receiverAssignments"]
    assert role_guid(roles, receiver) == [SERVICE_BUS_DATA_OWNER] * 2
    scoped_queues = [found["receiveQueues"]["raw"]["name"] for _ in expand(roles, receiver)]
    assert scoped_queues == ["name", "name"]  # one per item of receiveQueueNames
    assert roles.params["receiveQueueNames"] == ["orders", "order-events"]
    assert receiver["raw"]["scope"]["operator"]["operands"]["operand_1"] == "receiveQueues"


def test_sender_role_only_on_the_outbox_destinations(main: Scope) -> None:
    roles = main.module("roles")
    found = resources(roles)
    sender = found["senderAssignments"]
    assert role_guid(roles, sender) == [SERVICE_BUS_DATA_SENDER] * 2
    assert roles.params["sendQueueNames"] == ["order-accepted", "order-rejected"]
    assert sender["raw"]["scope"]["operator"]["operands"]["operand_1"] == "sendQueues"


def role_assignments(roles: Scope) -> list[tuple[str, dict, str]]:
    """Every role assignment the roles module makes, Azure RBAC and Cosmos SQL alike: one (name, config,
    role GUID) per copy."""
    found = []
    for name, resource in resources(roles).items():
        if resource["type"] == "Microsoft.Authorization/roleAssignments":
            found += [(name, copy, role) for copy, role in
                      zip(expand(roles, resource), role_guid(roles, resource), strict=True)]
        elif resource["type"] == "Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments":
            found += [(name, copy, copy["properties"]["roleDefinitionId"].rsplit("/", 1)[-1])
                      for copy in expand(roles, resource)]
    return found


def text(value: object) -> str:
    return value.expression if isinstance(value, Unresolved) else str(value)


@pytest.mark.parametrize("operator", ["", OPERATOR])
def test_no_role_is_granted_on_the_whole_namespace_or_above(operator: str) -> None:
    roles = main_scope(operatorPrincipalId=operator).module("roles")
    for name, assignment, _ in role_assignments(roles):
        if "scope" in assignment:  # Azure RBAC: on a resource
            assert text(assignment["scope"]).split("[")[0] in {
                "receiveQueues", "sendQueues", "operatorQueues", "storage", "applicationInsights"}, name
        else:  # Cosmos SQL: on a data-plane path
            assert assignment["properties"]["scope"] == "<cosmos.id>/dbs/sales", name


def test_the_app_sends_only_to_the_outbox_destinations(main: Scope) -> None:
    senders = [(name, text(assignment["scope"]).split("[")[0]) for name, assignment, role
               in role_assignments(main.module("roles")) if role == SERVICE_BUS_DATA_SENDER]
    assert senders == [("senderAssignments", "sendQueues")] * 2


def test_cosmos_data_contributor_is_scoped_to_the_database(main: Scope) -> None:
    assignment = resources(main.module("roles"))["cosmosAssignment"]
    assert assignment["type"] == "Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments"
    properties = assignment["config"]["properties"]
    assert properties["roleDefinitionId"].endswith(f"/sqlRoleDefinitions/{COSMOS_DATA_CONTRIBUTOR}")
    assert properties["scope"] == "<cosmos.id>/dbs/sales"


@pytest.mark.parametrize("operator", ["", OPERATOR])
def test_role_assignment_names_are_guids_of_scope_principal_and_role(operator: str) -> None:
    assignments = role_assignments(main_scope(operatorPrincipalId=operator).module("roles"))
    assert len(assignments) == 8 + (4 * 3 + 1 if operator else 0)
    for name, assignment, role in assignments:
        principal = text(assignment["properties"]["principalId"])
        # A Cosmos SQL assignment is scoped to the database: the account and the database name stand for it.
        scope = f"{text(assignment['scope'])}.id" if "scope" in assignment else "cosmos.id, sales"
        assert assignment["name"] == Unresolved(f"guid({scope}, {principal}, {role})"), name


@pytest.mark.parametrize("operator", ["", OPERATOR])
def test_host_storage_gets_blob_data_owner_and_table_data_contributor_and_nothing_else(operator: str) -> None:
    # Blob Data Owner: the host's blobs, the timers' leases and status, the Flex deployment package. Table Data
    # Contributor: the host's diagnostic events. No Queue Data Contributor: no blob trigger, Durable Functions or
    # queue binding (infra/modules/roles.bicep, above storageAssignments, has the sources).
    roles = main_scope(operatorPrincipalId=operator).module("roles")
    on_storage = [(name, role) for name, assignment, role in role_assignments(roles)
                  if "scope" in assignment and text(assignment["scope"]).split("[")[0] == "storage"]
    assert sorted(on_storage) == [("storageAssignments", STORAGE_TABLE_DATA_CONTRIBUTOR),
                                  ("storageAssignments", STORAGE_BLOB_DATA_OWNER)]
    assert STORAGE_QUEUE_DATA_CONTRIBUTOR not in {role for _, _, role in role_assignments(roles)}


def operator_assignment(roles: Scope, name: str) -> list[tuple[str, Unresolved, str, str]]:
    found = resources(roles)
    return [(role, copy["scope"], copy["properties"]["principalId"], copy["properties"]["principalType"])
            for role, copy in zip(role_guid(roles, found[name]), expand(roles, found[name]), strict=True)]


def test_no_operator_roles_without_an_operator(main: Scope) -> None:
    found = resources(main.module("roles"))
    operator_grants = [name for name in found if name.startswith("operator") and not found[name]["existing"]]
    assert operator_grants == ["operatorReceiverAssignments", "operatorSenderAssignments", "operatorOwnerAssignments",
                               "operatorCosmosAssignment"]
    assert all(found[name]["deployed"] is False for name in operator_grants)
    assert main.params["operatorPrincipalId"] == ""
    assert main.params["operatorPrincipalType"] == "User"


def test_operator_queues_are_all_four(main: Scope) -> None:
    roles = main_scope(operatorPrincipalId=OPERATOR).module("roles")
    queues = [copy["name"] for copy in expand(roles, resources(roles)["operatorQueues"])]
    assert queues == ["orders", "order-events", "order-accepted", "order-rejected"]


@pytest.mark.parametrize(("name", "role"), [
    ("operatorReceiverAssignments", SERVICE_BUS_DATA_RECEIVER),
    ("operatorSenderAssignments", SERVICE_BUS_DATA_SENDER),
    ("operatorOwnerAssignments", SERVICE_BUS_DATA_OWNER),
])
def test_operator_gets_each_service_bus_role_on_each_queue(name: str, role: str) -> None:
    roles = main_scope(operatorPrincipalId=OPERATOR).module("roles")
    assert operator_assignment(roles, name) == [
        (role, Unresolved(f"operatorQueues[{i}]"), OPERATOR, "User") for i in range(4)
    ]


def test_operator_principal_type_is_a_parameter() -> None:
    allowed = [d for d in parse("main.bicep")["parameters"]["operatorPrincipalType"]["decorators"]
               if d["type"] == "allowed"]
    assert allowed[0]["argument"] == ["User", "Group", "ServicePrincipal"]
    roles = main_scope(operatorPrincipalId=OPERATOR, operatorPrincipalType="Group").module("roles")
    assert {kind for *_, kind in operator_assignment(roles, "operatorOwnerAssignments")} == {"Group"}


def test_operator_gets_the_cosmos_data_contributor_role_on_the_database() -> None:
    found = resources(main_scope(operatorPrincipalId=OPERATOR).module("roles"))
    assignment = found["operatorCosmosAssignment"]
    assert assignment["deployed"] is True
    properties = assignment["config"]["properties"]
    assert properties["principalId"] == OPERATOR
    assert properties["roleDefinitionId"].endswith(f"/sqlRoleDefinitions/{COSMOS_DATA_CONTRIBUTOR}")
    assert properties["scope"] == "<cosmos.id>/dbs/sales"


# The closed network (privateNetwork): off by default, so that a first deploy stays simple.

PRIVATE_ENDPOINTS = {  # groupId: (the module whose resource it reaches, its private DNS zone)
    "blob": ("storage", "privatelink.blob.core.windows.net"),
    "table": ("storage", "privatelink.table.core.windows.net"),
    "Sql": ("cosmos", "privatelink.documents.azure.com"),
    "namespace": ("serviceBus", "privatelink.servicebus.windows.net"),
}
DATA_PLANES = {"storage": "account", "cosmos": "account", "serviceBus": "namespace"}


def test_open_by_default_no_network_and_every_data_plane_public_with_entra_id_only(main: Scope) -> None:
    assert main.params["privateNetwork"] is False
    assert main.deploys_module("network") is False
    for module, resource in DATA_PLANES.items():
        assert resources(main.module(module))[resource]["config"]["properties"]["publicNetworkAccess"] == "Enabled"
    assert main.module("functionApp").params["virtualNetworkSubnetId"] == ""
    assert resources(main.module("functionApp"))["site"]["config"]["properties"]["virtualNetworkSubnetId"] is None


def test_closed_every_data_plane_refuses_public_traffic() -> None:
    closed = main_scope(privateNetwork=True)
    for module, resource in DATA_PLANES.items():
        properties = resources(closed.module(module))[resource]["config"]["properties"]
        assert properties["publicNetworkAccess"] == "Disabled", module
    storage = resources(closed.module("storage"))["account"]["config"]["properties"]
    assert storage["networkAcls"] == {"defaultAction": "Deny", "bypass": "None"}
    assert storage["allowSharedKeyAccess"] is False  # still Entra ID only inside the network


def test_closed_a_private_endpoint_with_its_dns_zone_for_each_data_plane() -> None:
    closed = main_scope(privateNetwork=True)
    assert closed.deploys_module("network") is True
    network = closed.module("network")
    assert network.params["storageAccountName"] == Unresolved("storage.outputs.name")
    found = resources(network)
    endpoints = expand(network, found["privateEndpoints"])
    groups = {c["properties"]["privateLinkServiceConnections"][0]["properties"]["groupIds"][0]: c for c in endpoints}
    assert set(groups) == set(PRIVATE_ENDPOINTS)
    targets = {"storage": Unresolved("storage.id"), "cosmos": Unresolved("cosmos.id"),
               "serviceBus": Unresolved("serviceBus.id")}
    for group, (module, _) in PRIVATE_ENDPOINTS.items():
        connection = groups[group]["properties"]["privateLinkServiceConnections"][0]["properties"]
        assert connection["privateLinkServiceId"] == targets[module], group
        assert groups[group]["properties"]["subnet"] == {"id": Unresolved("vnet::endpointSubnet.id")}
    assert all(found[name]["existing"] for name in ("storage", "cosmos", "serviceBus"))
    # Each endpoint's name resolves in its zone, linked to the network, without auto-registration.
    zones = [z["name"] for z in expand(network, found["zones"])]
    assert zones == [zone for _, zone in PRIVATE_ENDPOINTS.values()]
    configs = [g["properties"]["privateDnsZoneConfigs"] for g in expand(network, found["zoneGroups"])]
    assert [c[0]["properties"]["privateDnsZoneId"] for c in configs] == [
        Unresolved(f"zones[{i}].id") for i in range(len(zones))]
    links = expand(network, found["zoneLinks"])
    assert all(link["properties"] == {"registrationEnabled": False, "virtualNetwork": {"id": Unresolved("vnet.id")}}
               for link in links) and len(links) == len(zones)


def test_closed_the_app_is_integrated_through_a_subnet_delegated_to_flex_consumption() -> None:
    closed = main_scope(privateNetwork=True)
    assert closed.module("functionApp").params["virtualNetworkSubnetId"] == Unresolved("network.outputs.appSubnetId")
    subnet = "/subscriptions/s/resourceGroups/rg-dev/providers/Microsoft.Network/virtualNetworks/vnet-t/subnets/app"
    given = {**closed.module("functionApp").params, "virtualNetworkSubnetId": subnet}
    site = resources(Scope.with_defaults("modules/functionapp.bicep", given))["site"]["config"]["properties"]
    assert site["virtualNetworkSubnetId"] == subnet
    vnet = resources(closed.module("network"))["vnet"]["config"]["properties"]
    app, endpoints = vnet["subnets"]
    assert app["properties"]["delegations"] == [
        {"name": "flex-consumption", "properties": {"serviceName": "Microsoft.App/environments"}}]
    assert "_" not in app["name"]  # Flex Consumption refuses a subnet name with an underscore
    prefix = int(app["properties"]["addressPrefix"].split("/")[1])
    assert prefix <= 27  # Microsoft's recommendation for one app: Flex takes at most 27 addresses per subnet
    assert "delegations" not in endpoints["properties"]  # the app's subnet holds no private endpoint
    assert endpoints["properties"]["privateEndpointNetworkPolicies"] == "Disabled"


def test_closed_service_bus_is_premium_whatever_the_tier_parameter_says() -> None:
    # Only Premium takes private endpoints; a Premium namespace is sized in messaging units (1 by default).
    closed = resources(main_scope(privateNetwork=True).module("serviceBus"))["namespace"]["config"]
    assert closed["sku"] == {"name": "Premium", "tier": "Premium", "capacity": 1}
    sized = resources(main_scope(privateNetwork=True, serviceBusMessagingUnits=2).module("serviceBus"))
    assert sized["namespace"]["config"]["sku"]["capacity"] == 2
    open_standard = resources(main_scope().module("serviceBus"))["namespace"]["config"]
    assert open_standard["sku"] == {"name": "Standard", "tier": "Standard"}
