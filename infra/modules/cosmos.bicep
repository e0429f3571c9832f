// Cosmos DB (NoSQL): Entra ID only, session consistency, serverless or autoscale.
param location string
param tags object
param resourceToken string
@description('false: the account takes no traffic from the internet, only through its private endpoint (main.bicep\'s privateNetwork).')
param publicAccess bool = true
param capacityMode string
param autoscaleMaxThroughput int
param databaseName string
param ordersContainerName string
param leasesContainerName string
@allowed([
  'lean'
  'migrating'
])
param ordersIndexing string = 'lean'

var serverless = capacityMode == 'serverless'
var leanPolicy = loadJsonContent('../orders-indexing-policy.json')
var migratingPolicy = loadJsonContent('../orders-indexing-policy-migrating.json')

resource account 'Microsoft.DocumentDB/databaseAccounts@2026-03-15' = {
  // checkov:skip=CKV_AZURE_101: public only with privateNetwork false (the default, for a first deploy), Entra ID tokens only (disableLocalAuth); with it true, public access is disabled and a private endpoint serves the app
  // checkov:skip=CKV_AZURE_99: as above: without privateNetwork no ipRules either, Entra ID tokens only
  name: 'cosmos-${resourceToken}'
  location: location
  tags: tags
  kind: 'GlobalDocumentDB'
  properties: {
    databaseAccountOfferType: 'Standard'
    disableLocalAuth: true
    disableKeyBasedMetadataWriteAccess: true
    minimalTlsVersion: 'Tls12'
    publicNetworkAccess: publicAccess ? 'Enabled' : 'Disabled'
    consistencyPolicy: {
      defaultConsistencyLevel: 'Session'
    }
    locations: [
      {
        locationName: location
        failoverPriority: 0
        isZoneRedundant: false
      }
    ]
    capabilities: serverless ? [
      {
        name: 'EnableServerless'
      }
    ] : []
  }
}

resource database 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases@2026-03-15' = {
  parent: account
  name: databaseName
  properties: {
    resource: {
      id: databaseName
    }
    options: serverless ? {} : {
      autoscaleSettings: {
        maxThroughput: autoscaleMaxThroughput
      }
    }
  }
}

// Orders, their events' records, inbox markers, side-effect records and outbox documents, all
// partitioned by order. TTL on without a default (-1): only documents carrying a ttl expire.
// The indexing policy indexes only the paths the app's queries filter on (docs/performance.md,
// "Indexing policy"); the local setup (devservers.cosmos_setup) applies the same file. 'migrating' keeps the
// paths the release before queried too, for a container in use until the records it wrote carry their due
// (docs/operations.md, "Indexing: moving a container in use to the lean policy").
resource orders 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers@2026-03-15' = {
  parent: database
  name: ordersContainerName
  properties: {
    resource: {
      id: ordersContainerName
      // Large partition keys (version 2): a key's value hashed whole, up to 2 KB; version 1 hashes its first
      // 101 bytes. An order's id is at most 128 characters (up to 512 bytes). Set only when the container is made.
      partitionKey: {
        paths: [
          '/orderId'
        ]
        kind: 'Hash'
        version: 2
      }
      defaultTtl: -1
      indexingPolicy: ordersIndexing == 'migrating' ? migratingPolicy : leanPolicy
    }
  }
}

// Change-feed leases of publish_outbox.
resource leases 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers@2026-03-15' = {
  parent: database
  name: leasesContainerName
  properties: {
    resource: {
      id: leasesContainerName
      partitionKey: {
        paths: [
          '/id'
        ]
        kind: 'Hash'
      }
    }
  }
}

output name string = account.name
output endpoint string = account.properties.documentEndpoint
