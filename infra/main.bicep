// Idempotent consumer: everything it needs in Azure, in one resource group.
// Names derive from one resource token; connections use the function app's managed identity, and
// every data plane has local (key) authentication turned off.
targetScope = 'subscription'

@minLength(1)
@maxLength(48)
@description('Name of the environment (azd env name); part of the resource group and resource names.')
param environmentName string

@minLength(1)
@description('Azure region of every resource.')
param location string

@allowed([
  'Standard'
  'Premium'
])
@description('Service Bus tier. Basic has no duplicate detection and no sessions, so it is not offered. With privateNetwork, Premium whatever this says: only Premium takes private endpoints.')
param serviceBusSku string = 'Standard'

@allowed([
  1
  2
  4
  8
  16
])
@description('Messaging units of a Premium namespace (billed per unit and hour; docs/deploy.md, "A closed network", sizes them).')
param serviceBusMessagingUnits int = 1

@description('true: a closed network, chosen when an environment is created (switching a running one is not in place: docs/deploy.md). The function app is integrated into a virtual network, Storage (blob, table), Cosmos DB and Service Bus are reached through private endpoints with private DNS zones, and their public network access is disabled; Service Bus is then Premium. Operators reach the data planes from inside the network (docs/deploy.md, "A closed network"). false (the default): public endpoints, Entra ID tokens only.')
param privateNetwork bool = false

@description('Duplicate-detection history window of every queue (ISO 8601 duration, 20 s to 7 days).')
param duplicateDetectionWindow string = 'PT10M'

@minValue(5)
@maxValue(300)
@description('Queue lock duration in seconds (Service Bus allows 5 s to 5 min).')
param lockDurationSeconds int = 60

@minValue(1)
@maxValue(2000)
@description('MaxDeliveryCount of the input queues.')
param maxDeliveryCount int = 10

@minValue(60)
@description('Default message time to live of the queues, in seconds.')
param messageTtlSeconds int = 86400

@minValue(0)
@description('How long after dead-lettering an operator may still resubmit a message, in seconds.')
param dlqResubmitGraceSeconds int = 604800

@minValue(1)
@description('How long a message failing transiently is handed on to later copies, from its first hand-on, before it is dead-lettered RetryLimitExceeded, in seconds (RETRY_TOTAL_SECONDS).')
param retryTotalSeconds int = 14400

@minValue(1)
@description('Inbox marker TTL in seconds; must be at least lock x deliveries + delayed retries + message TTL + resubmit grace.')
param dedupTtlSeconds int = 777600

@allowed([
  'serverless'
  'autoscale'
])
@description('Cosmos DB capacity: serverless (pay per request) or provisioned autoscale throughput.')
param cosmosCapacityMode string = 'serverless'

@minValue(1000)
@description('Autoscale maximum RU/s of the database when cosmosCapacityMode is autoscale.')
param cosmosAutoscaleMaxThroughput int = 1000

@allowed([
  'lean'
  'migrating'
])
@description('The orders container\'s indexing policy: lean (type, due, orderId), or migrating (also the paths the release before queried), for a container in use until sbctl index backfill has run (docs/operations.md).')
param cosmosOrdersIndexing string = 'lean'

@description('Base URL of the fulfilment service that process_order calls; no default, so azd asks for it.')
param fulfillmentUrl string

@description('The fulfilment service\'s token scope (its application ID URI with /.default): each call carries a bearer token of the app\'s managed identity for it. Empty: no Authorization header.')
param fulfillmentTokenScope string = ''

@description('Name of this consumer; part of every inbox marker and downstream idempotency key.')
param consumerName string = 'order-projection'

// Flex Consumption runs 3.13 (docs/deploy.md, "Python version", names the sources). The local host and CI
// run 3.13, the one version on which Azure runs the pinned azure-functions-runtime; 3.11 and 3.12 stay
// allowed for the compatibility runs in docs/local-development.md.
@allowed([
  '3.11'
  '3.12'
  '3.13'
])
@description('Python version of the function app; keep it the version the local host and CI run (3.13).')
param pythonVersion string = '3.13'

@description('Object id of a user, group or service principal who runs the operator tools (sbctl); empty: no operator roles.')
param operatorPrincipalId string = ''

@allowed([
  'User'
  'Group'
  'ServicePrincipal'
])
@description('Kind of principal operatorPrincipalId names.')
param operatorPrincipalType string = 'User'

@description('Resource id of an existing action group that the alerts notify; empty: no alert rules are made.')
param actionGroupId string = ''

@description('true: the events queue requires sessions (one per order). false: a plain events queue, where the resequencer alone puts each order\'s events in order and a host runs maxConcurrentCalls of them at once. Switching deploys the other mode\'s queue; drain the old one first.')
param eventsSessions bool = true

@description('true: a new order\'s reservation claim is written inside the order document (one write fewer per order). Every release from the one that reads it takes both forms; set it only once no earlier release runs (docs/operations.md, "The reservation claim inside the order").')
param reservationClaimInOrder bool = false

var resourceToken = toLower(uniqueString(subscription().id, environmentName, location))
var tags = {
  'azd-env-name': environmentName
}
var databaseName = 'sales'
var ordersContainerName = 'orders'
var leasesContainerName = 'leases'
var ordersQueueName = 'orders'
// A queue's RequiresSession cannot change once it exists, so each mode has a queue of its own.
var eventsQueueName = eventsSessions ? 'order-events' : 'order-events-plain'
var outboxDestinationName = 'order-accepted'
var outboxRejectedDestinationName = 'order-rejected'
// Only Premium takes private endpoints (and public network access disabled).
var serviceBusTier = privateNetwork ? 'Premium' : serviceBusSku

resource rg 'Microsoft.Resources/resourceGroups@2025-04-01' = {
  name: 'rg-${environmentName}'
  location: location
  tags: tags
}

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring'
  scope: rg
  params: {
    location: location
    tags: tags
    resourceToken: resourceToken
  }
}

module storage 'modules/storage.bicep' = {
  name: 'storage'
  scope: rg
  params: {
    location: location
    tags: tags
    resourceToken: resourceToken
    publicAccess: !privateNetwork
  }
}

module serviceBus 'modules/servicebus.bicep' = {
  name: 'servicebus'
  scope: rg
  params: {
    location: location
    tags: tags
    resourceToken: resourceToken
    sku: serviceBusTier
    messagingUnits: serviceBusMessagingUnits
    publicAccess: !privateNetwork
    duplicateDetectionWindow: duplicateDetectionWindow
    lockDurationSeconds: lockDurationSeconds
    maxDeliveryCount: maxDeliveryCount
    messageTtlSeconds: messageTtlSeconds
    ordersQueueName: ordersQueueName
    eventsQueueName: eventsQueueName
    eventsRequireSession: eventsSessions
    outboxDestinationNames: [
      outboxDestinationName
      outboxRejectedDestinationName
    ]
  }
}

module cosmos 'modules/cosmos.bicep' = {
  name: 'cosmos'
  scope: rg
  params: {
    location: location
    tags: tags
    resourceToken: resourceToken
    capacityMode: cosmosCapacityMode
    autoscaleMaxThroughput: cosmosAutoscaleMaxThroughput
    databaseName: databaseName
    ordersContainerName: ordersContainerName
    leasesContainerName: leasesContainerName
    ordersIndexing: cosmosOrdersIndexing
    publicAccess: !privateNetwork
  }
}

// The closed network: made only with privateNetwork.
module network 'modules/network.bicep' = if (privateNetwork) {
  name: 'network'
  scope: rg
  params: {
    location: location
    tags: tags
    resourceToken: resourceToken
    storageAccountName: storage.outputs.name
    cosmosAccountName: cosmos.outputs.name
    serviceBusNamespaceName: serviceBus.outputs.name
  }
}

module functionApp 'modules/functionapp.bicep' = {
  name: 'functionapp'
  scope: rg
  params: {
    location: location
    tags: tags
    resourceToken: resourceToken
    pythonVersion: pythonVersion
    storageAccountName: storage.outputs.name
    deploymentContainerUrl: storage.outputs.deploymentContainerUrl
    applicationInsightsConnectionString: monitoring.outputs.applicationInsightsConnectionString
    virtualNetworkSubnetId: privateNetwork ? network.outputs.appSubnetId : ''
    appSettings: {
      ServiceBusConnection__fullyQualifiedNamespace: serviceBus.outputs.fullyQualifiedNamespace
      CosmosDBConnection__accountEndpoint: cosmos.outputs.endpoint
      COSMOS_ENDPOINT: cosmos.outputs.endpoint
      COSMOS_DATABASE: databaseName
      COSMOS_CONTAINER: ordersContainerName
      COSMOS_LEASES_CONTAINER: leasesContainerName
      ORDERS_QUEUE: ordersQueueName
      ORDER_EVENTS_QUEUE: eventsQueueName
      ORDER_EVENTS_SESSIONS: string(eventsSessions)
      RESERVATION_CLAIM_IN_ORDER: string(reservationClaimInOrder)
      OUTBOX_DESTINATION: outboxDestinationName
      OUTBOX_REJECTED_DESTINATION: outboxRejectedDestinationName
      CONSUMER_NAME: consumerName
      FULFILLMENT_URL: fulfillmentUrl
      FULFILLMENT_TOKEN_SCOPE: fulfillmentTokenScope
      // Derived from the parameters that configure the queues, so app and queues cannot disagree.
      SERVICEBUS_LOCK_DURATION_SECONDS: string(lockDurationSeconds)
      SERVICEBUS_MAX_DELIVERY_COUNT: string(maxDeliveryCount)
      SERVICEBUS_MESSAGE_TTL_SECONDS: string(messageTtlSeconds)
      DLQ_RESUBMIT_GRACE_SECONDS: string(dlqResubmitGraceSeconds)
      RETRY_TOTAL_SECONDS: string(retryTotalSeconds)
      DEDUP_TTL_SECONDS: string(dedupTtlSeconds)
    }
  }
}

module roles 'modules/roles.bicep' = {
  name: 'roles'
  scope: rg
  params: {
    principalId: functionApp.outputs.principalId
    serviceBusNamespaceName: serviceBus.outputs.name
    receiveQueueNames: [
      ordersQueueName
      eventsQueueName
    ]
    sendQueueNames: [
      outboxDestinationName
      outboxRejectedDestinationName
    ]
    cosmosAccountName: cosmos.outputs.name
    databaseName: databaseName
    storageAccountName: storage.outputs.name
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    operatorPrincipalId: operatorPrincipalId
    operatorPrincipalType: operatorPrincipalType
    operatorQueueNames: [
      ordersQueueName
      eventsQueueName
      outboxDestinationName
      outboxRejectedDestinationName
    ]
  }
}

// The operator's dashboard: free, so always made.
module workbook 'modules/workbook.bicep' = {
  name: 'workbook'
  scope: rg
  params: {
    location: location
    tags: tags
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    serviceBusNamespaceName: serviceBus.outputs.name
  }
}

// Only with somewhere to send them: a rule that notifies nobody would still be evaluated and billed.
module alerts 'modules/alerts.bicep' = if (!empty(actionGroupId)) {
  name: 'alerts'
  scope: rg
  params: {
    location: location
    tags: tags
    resourceToken: resourceToken
    actionGroupId: actionGroupId
    serviceBusNamespaceName: serviceBus.outputs.name
    queueNames: [
      ordersQueueName
      eventsQueueName
      outboxDestinationName
      outboxRejectedDestinationName
    ]
    applicationInsightsName: monitoring.outputs.applicationInsightsName
  }
}

output AZURE_LOCATION string = location
output AZURE_RESOURCE_GROUP string = rg.name
output FUNCTION_APP_NAME string = functionApp.outputs.name
output SERVICEBUS_NAMESPACE string = serviceBus.outputs.fullyQualifiedNamespace
output COSMOS_ENDPOINT string = cosmos.outputs.endpoint
