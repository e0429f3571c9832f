// Least-privilege role assignments for the function app's managed identity, and for an operator.
param principalId string
param serviceBusNamespaceName string
param receiveQueueNames array
@description('The queues the app publishes to: the outbox destinations.')
param sendQueueNames array
param cosmosAccountName string
param databaseName string
param storageAccountName string
param applicationInsightsName string

@description('Object id of the operator who runs sbctl; empty: no operator roles are granted.')
param operatorPrincipalId string = ''
param operatorPrincipalType string = 'User'
@description('The queues the operator sends to, receives and resubmits from.')
param operatorQueueNames array = []

var operator = !empty(operatorPrincipalId)

var roles = {
  serviceBusDataReceiver: '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'
  serviceBusDataSender: '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
  serviceBusDataOwner: '090c5cfd-751d-490a-894a-3ce6f1109419'
  storageBlobDataOwner: 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
  storageTableDataContributor: '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
  monitoringMetricsPublisher: '3913510d-42f4-4e42-8a64-420c390055eb'
}
// Cosmos DB Built-in Data Contributor (a data-plane SQL role, not an Azure RBAC role).
var cosmosDataContributor = '00000000-0000-0000-0000-000000000002'

resource namespace 'Microsoft.ServiceBus/namespaces@2026-01-01' existing = {
  name: serviceBusNamespaceName
}

resource receiveQueues 'Microsoft.ServiceBus/namespaces/queues@2026-01-01' existing = [for name in receiveQueueNames: {
  parent: namespace
  name: name
}]

resource sendQueues 'Microsoft.ServiceBus/namespaces/queues@2026-01-01' existing = [for name in sendQueueNames: {
  parent: namespace
  name: name
}]

// Data Owner on the two input queues only. The trigger needs Data Receiver or Data Owner (the Service Bus bindings'
// identity table); target-based scaling reads each queue's message count, which needs Manage rights, and Data
// Owner is the data role that grants them: with Listen rights alone the scale controller falls back to incremental
// scaling (functions-target-based-scaling, "Service Bus"; azure-functions-host#8892; Microsoft's Flex Consumption
// Service Bus sample grants Data Owner). It grants Send too, which the delayed retries need: a message handed on is
// a copy the app schedules on its own input queue. Scoped to each queue, never the namespace.
resource receiverAssignments 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in receiveQueueNames: {
  name: guid(receiveQueues[i].id, principalId, roles.serviceBusDataOwner)
  scope: receiveQueues[i]
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataOwner)
  }
}]

// Sender on the outbox destinations only.
resource senderAssignments 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in sendQueueNames: {
  name: guid(sendQueues[i].id, principalId, roles.serviceBusDataSender)
  scope: sendQueues[i]
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
  }
}]

resource cosmos 'Microsoft.DocumentDB/databaseAccounts@2026-03-15' existing = {
  name: cosmosAccountName
}

// Data Contributor scoped to the database, not the account.
resource cosmosAssignment 'Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2026-03-15' = {
  parent: cosmos
  name: guid(cosmos.id, databaseName, principalId, cosmosDataContributor)
  properties: {
    principalId: principalId
    roleDefinitionId: '${cosmos.id}/sqlRoleDefinitions/${cosmosDataContributor}'
    scope: '${cosmos.id}/dbs/${databaseName}'
  }
}

resource storage 'Microsoft.Storage/storageAccounts@2026-04-01' existing = {
  name: storageAccountName
}

// Host storage (AzureWebJobsStorage__accountName, identity-based): the two data roles the features this app uses need.
// - Storage Blob Data Owner: the host's own blobs (primary-host lock, keys; it creates their containers), the timer
//   triggers' singleton lease and schedule status, and the Flex Consumption deployment package (a blob container
//   the platform reads with this identity).
// - Storage Table Data Contributor: the Functions 4.x host persists diagnostic events (troubleshooting events it
//   raises even when an error keeps the app from starting) in AzureFunctionsDiagnosticEvents<yyyyMM> tables over
//   this connection; it lists, creates and deletes tables and writes entities. Without the role it logs a 403
//   warning and turns the feature off.
// No Storage Queue Data Contributor: queues in host storage serve the blob trigger (its internal and poison queues), Durable
// Functions and queue bindings, none of which the app has; its triggers are Service Bus, Cosmos DB (leases in
// Cosmos DB) and timers. Sources: "Connecting to host storage with an identity" (learn.microsoft.com/azure/
// azure-functions/functions-reference), DiagnosticEventTableStorageRepository.cs in Azure/azure-functions-host
// (identity-based since #10438). tests/infra/test_bicep.py pins this exact set.
resource storageAssignments 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for role in [
  roles.storageBlobDataOwner
  roles.storageTableDataContributor
]: {
  name: guid(storage.id, principalId, role)
  scope: storage
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', role)
  }
}]

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

// Telemetry ingestion with Entra ID (local auth is off on Application Insights).
resource telemetryAssignment 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(applicationInsights.id, principalId, roles.monitoringMetricsPublisher)
  scope: applicationInsights
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.monitoringMetricsPublisher)
  }
}

resource operatorQueues 'Microsoft.ServiceBus/namespaces/queues@2026-01-01' existing = [for name in operatorQueueNames: {
  parent: namespace
  name: name
}]

// The operator's everyday sbctl work, per queue: send (send, dlq resubmit) and receive (dlq list, resubmit, purge).
resource operatorReceiverAssignments 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in operatorQueueNames: if (operator) {
  name: guid(operatorQueues[i].id, operatorPrincipalId, roles.serviceBusDataReceiver)
  scope: operatorQueues[i]
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataReceiver)
  }
}]

resource operatorSenderAssignments 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in operatorQueueNames: if (operator) {
  name: guid(operatorQueues[i].id, operatorPrincipalId, roles.serviceBusDataSender)
  scope: operatorQueues[i]
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
  }
}]

// sbctl reads a queue's duplicate-detection window with ServiceBusAdministrationClient.get_queue: a GET of
// the entity description on the namespace's data-plane (ATOM) endpoint, not an ARM read, so Reader would
// not do. The service asks for the Manage or EntityRead claim even for a read, and among the built-in roles
// only Azure Service Bus Data Owner carries it; it is granted per queue, never on the namespace. Without it
// sbctl falls back to --detection-window, or to PT10M, this template's default.
resource operatorOwnerAssignments 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in operatorQueueNames: if (operator) {
  name: guid(operatorQueues[i].id, operatorPrincipalId, roles.serviceBusDataOwner)
  scope: operatorQueues[i]
  properties: {
    principalId: operatorPrincipalId
    principalType: operatorPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataOwner)
  }
}]

// sbctl parked list, release and drop read and write the orders container: the app's own data role, on the database.
resource operatorCosmosAssignment 'Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2026-03-15' = if (operator) {
  parent: cosmos
  name: guid(cosmos.id, databaseName, operatorPrincipalId, cosmosDataContributor)
  properties: {
    principalId: operatorPrincipalId
    roleDefinitionId: '${cosmos.id}/sqlRoleDefinitions/${cosmosDataContributor}'
    scope: '${cosmos.id}/dbs/${databaseName}'
  }
}
