// Service Bus: Standard tier or above (duplicate detection, sessions), Entra ID only, TLS 1.2.
param location string
param tags object
param resourceToken string
param sku string
@description('Premium only: the namespace\'s messaging units.')
param messagingUnits int = 1
@description('false: the namespace takes no traffic from the internet, only through its private endpoint (Premium; main.bicep\'s privateNetwork).')
param publicAccess bool = true
param duplicateDetectionWindow string
param lockDurationSeconds int
param maxDeliveryCount int
param messageTtlSeconds int
param ordersQueueName string
param eventsQueueName string
@description('Whether the events queue requires sessions (ORDER_EVENTS_SESSIONS).')
param eventsRequireSession bool = true
@description('The queues the outbox publishes to: OrderAccepted, OrderRejected.')
param outboxDestinationNames array

var inputQueue = {
  requiresDuplicateDetection: true
  duplicateDetectionHistoryTimeWindow: duplicateDetectionWindow
  lockDuration: 'PT${lockDurationSeconds}S'
  maxDeliveryCount: maxDeliveryCount
  deadLetteringOnMessageExpiration: true
  defaultMessageTimeToLive: 'PT${messageTtlSeconds}S'
}

resource namespace 'Microsoft.ServiceBus/namespaces@2026-01-01' = {
  name: 'sb-${resourceToken}'
  location: location
  tags: tags
  // A Premium namespace is sized in messaging units; the other tiers take none.
  sku: (sku == 'Premium') ? {
    name: sku
    tier: sku
    capacity: messagingUnits
  } : {
    name: sku
    tier: sku
  }
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: publicAccess ? 'Enabled' : 'Disabled'
  }
}

resource ordersQueue 'Microsoft.ServiceBus/namespaces/queues@2026-01-01' = {
  parent: namespace
  name: ordersQueueName
  properties: union(inputQueue, {
    requiresSession: false
  })
}

resource eventsQueue 'Microsoft.ServiceBus/namespaces/queues@2026-01-01' = {
  parent: namespace
  name: eventsQueueName
  properties: union(inputQueue, {
    requiresSession: eventsRequireSession
  })
}

resource outboxQueues 'Microsoft.ServiceBus/namespaces/queues@2026-01-01' = [for name in outboxDestinationNames: {
  parent: namespace
  name: name
  properties: {
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: duplicateDetectionWindow
    lockDuration: 'PT${lockDurationSeconds}S'
    maxDeliveryCount: maxDeliveryCount
    deadLetteringOnMessageExpiration: true
    defaultMessageTimeToLive: 'PT${messageTtlSeconds}S'
    requiresSession: false
  }
}]

output name string = namespace.name
output fullyQualifiedNamespace string = '${namespace.name}.servicebus.windows.net'
