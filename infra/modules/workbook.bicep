// The operator's dashboard: an Azure Monitor workbook over the app's own log records (Application Insights' traces)
// and the namespace's dead-letter metric. Its panels and their queries are in infra/workbook/panels.json, which
// tests/infra/test_workbook.py runs over the records the app writes, and `python -m demo.workbook` draws from the
// demo's records (docs/operations.md shows that picture).
param location string
param tags object
param applicationInsightsName string
param serviceBusNamespaceName string

var content = loadJsonContent('../workbook/panels.json')

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

resource namespace 'Microsoft.ServiceBus/namespaces@2026-01-01' existing = {
  name: serviceBusNamespaceName
}

var queryItems = [for panel in content.panels: {
  type: 3
  name: panel.name
  content: {
    version: 'KqlItem/1.0'
    title: panel.title
    query: panel.query
    size: 0
    queryType: 0
    resourceType: 'microsoft.insights/components'
    visualization: panel.visualization
    timeContext: {
      durationMs: 86400000
    }
  }
}]

var deadLetterMetric = {
  type: 10
  name: 'dead-lettered-per-queue'
  content: {
    chartId: 'dead-lettered-per-queue'
    version: 'MetricsItem/2.0'
    title: 'Messages in each queue\'s dead-letter queue (Service Bus; MaxDeliveryCountExceeded included)'
    size: 0
    chartType: 2
    resourceType: 'microsoft.servicebus/namespaces'
    metricScope: 0
    resourceIds: [
      namespace.id
    ]
    timeContext: {
      durationMs: 86400000
    }
    metrics: [
      {
        namespace: 'microsoft.servicebus/namespaces'
        metric: 'microsoft.servicebus/namespaces--DeadletteredMessages'
        aggregation: 3
        splitBy: 'EntityName'
      }
    ]
  }
}

resource dashboard 'Microsoft.Insights/workbooks@2023-06-01' = {
  name: guid(resourceGroup().id, 'idempotent-consumer-workbook')
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: content.title
    category: 'workbook'
    sourceId: applicationInsights.id
    serializedData: string({
      version: 'Notebook/1.0'
      items: concat(queryItems, [
        deadLetterMetric
      ])
      fallbackResourceIds: [
        applicationInsights.id
      ]
    })
  }
}

output name string = dashboard.name
