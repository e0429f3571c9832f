// Alerts, each routed to one action group: dead letters per queue (a Service Bus metric), and from the
// app's log records in Application Insights: events parked too long, side effects stuck, a breaker opened (a
// dependency down), failed settlements.
// main.bicep deploys this module only when it is given an action group: a rule that notifies nobody is
// only a cost.
param location string
param tags object
param resourceToken string

@description('Resource id of the action group every alert notifies.')
param actionGroupId string
param serviceBusNamespaceName string
param queueNames array
param applicationInsightsName string

resource namespace 'Microsoft.ServiceBus/namespaces@2026-01-01' existing = {
  name: serviceBusNamespaceName
}

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

// DeadletteredMessages counts what sits in a queue's dead-letter queue, so the alert stays fired until an
// operator resubmits or purges it (docs/operations.md, "Dead-letter reasons").
resource deadLetterAlerts 'Microsoft.Insights/metricAlerts@2026-01-01' = [for queue in queueNames: {
  name: 'alert-${resourceToken}-deadletters-${queue}'
  location: 'global'
  tags: tags
  properties: {
    description: 'Messages in the dead-letter queue of ${queue}: list them with sbctl dlq list --queue ${queue}.'
    severity: 2
    enabled: true
    scopes: [
      namespace.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'DeadLetteredMessages'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'DeadletteredMessages'
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: [
                queue
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Maximum'
        }
      ]
    }
    autoMitigate: true
    actions: [
      {
        actionGroupId: actionGroupId
      }
    ]
  }
}]

// Over the log records (the traces table), not the consumer.overdue counter: the records reach Application
// Insights whichever exporter sends the metrics. report_stuck logs one warning per overdue item on each run
// (every 5 minutes by default), after PARKED_ALERT_AFTER_SECONDS or SIDE_EFFECT_STUCK_AFTER_SECONDS, so any
// record in the window is an alert. docs/deploy.md shows each query; a test keeps the two the same.
var logAlerts = [
  {
    name: 'parked'
    displayName: 'Events parked past PARKED_ALERT_AFTER_SECONDS'
    description: 'An event waits for a predecessor that has not come: find it (often in a dead-letter queue) and resubmit it, or sbctl parked release or drop the event.'
    query: '''
traces
| where message startswith "overdue parked "
| project timestamp, message
'''
  }
  {
    name: 'side-effects'
    displayName: 'Side effects stuck in progress'
    description: 'A fulfilment reservation is still in progress past its lease: its claiming message is not being redelivered (dead-lettered, or its lock lost); see docs/operations.md, Outcomes, in_progress.'
    query: '''
traces
| where message startswith "overdue side-effect "
| project timestamp, message
'''
  }
  {
    name: 'breaker'
    displayName: 'A dependency is down: most deliveries of a queue fail transiently'
    description: 'An instance opened its breaker: most of its recent attempts on a queue failed transiently (the fulfilment service or Cosmos DB down), and it hands messages on for a delayed retry untried. Nothing is lost; see docs/operations.md, In an outage.'
    query: '''
traces
| where message startswith "breaker open "
| project timestamp, message
'''
  }
  {
    name: 'identity'
    displayName: 'The app\'s identity cannot call a service it depends on'
    description: 'A delivery found the fulfilment service refusing the app\'s managed identity (401 or 403), or could not get a token for it (the identity endpoint failing): the same for every message, so they are handed on as in an outage and the breaker opens. Not allowed, or the identity refused: grant the identity its role at the service, or check FULFILLMENT_TOKEN_SCOPE; the token endpoint failing: an outage that ends by itself. See docs/operations.md, In an outage.'
    query: '''
traces
| where message startswith "delivery " and message contains " app identity: "
| project timestamp, message
'''
  }
  {
    name: 'settlements'
    displayName: 'Failed settlements'
    description: 'A complete, abandon or dead-letter call failed (usually a lost lock); Service Bus redelivers the message. Many in a row point at lock durations or a struggling host.'
    query: '''
traces
| where severityLevel >= 3 and message startswith "settlement " and message contains " failed messageId="
| project timestamp, message
'''
  }
]

resource logAlertRules 'Microsoft.Insights/scheduledQueryRules@2026-03-01' = [for rule in logAlerts: {
  name: 'alert-${resourceToken}-${rule.name}'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: rule.displayName
    description: rule.description
    severity: 2
    enabled: true
    scopes: [
      applicationInsights.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    criteria: {
      allOf: [
        {
          query: rule.query
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: true
    actions: {
      actionGroups: [
        actionGroupId
      ]
    }
  }
}]
