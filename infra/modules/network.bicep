// The closed network (main.bicep's privateNetwork): a virtual network the function app is integrated into, and for
// each data plane it reaches (Storage's blob and table, Cosmos DB, Service Bus) a private endpoint whose
// name resolves inside the network through a private DNS zone. The data planes' public access is disabled in their
// own modules; Application Insights ingestion stays public (docs/deploy.md, "A closed network").
param location string
param tags object
param resourceToken string
param storageAccountName string
param cosmosAccountName string
param serviceBusNamespaceName string

@description('Address space of the virtual network.')
param addressPrefix string = '10.40.0.0/16'

// Flex Consumption integrates through a subnet delegated to Microsoft.App/environments, used by nothing else (no private
// endpoints), with no '_' in its name; it takes at most 27 addresses per subnet, so Microsoft recommends a /27 for one
// app. A /24 leaves room to put more apps in, each in a subnet of its own. The private endpoints take another (one
// address each).
@description('The app\'s subnet, inside addressPrefix.')
param appSubnetPrefix string = '10.40.1.0/24'

@description('The private endpoints\' subnet, inside addressPrefix.')
param endpointSubnetPrefix string = '10.40.2.0/24'

var appSubnetName = 'app'
var endpointSubnetName = 'private-endpoints'

resource storage 'Microsoft.Storage/storageAccounts@2026-04-01' existing = {
  name: storageAccountName
}

resource cosmos 'Microsoft.DocumentDB/databaseAccounts@2026-03-15' existing = {
  name: cosmosAccountName
}

resource serviceBus 'Microsoft.ServiceBus/namespaces@2026-01-01' existing = {
  name: serviceBusNamespaceName
}

// Each private endpoint: the resource, its sub-resource (groupId) and the zone its name resolves in (public cloud).
// The host needs Storage's blob (its timers' leases, its keys, the deployment package) and table (its diagnostic
// events); queue only for triggers this app has none of (blob, Durable Functions), so it gets no endpoint.
var endpoints = [
  {
    name: 'blob'
    target: storage.id
    groupId: 'blob'
    zone: 'privatelink.blob.core.windows.net'
  }
  {
    name: 'table'
    target: storage.id
    groupId: 'table'
    zone: 'privatelink.table.core.windows.net'
  }
  {
    name: 'cosmos'
    target: cosmos.id
    groupId: 'Sql'
    zone: 'privatelink.documents.azure.com'
  }
  {
    name: 'servicebus'
    target: serviceBus.id
    groupId: 'namespace'
    zone: 'privatelink.servicebus.windows.net'
  }
]

resource vnet 'Microsoft.Network/virtualNetworks@2025-09-01' = {
  name: 'vnet-${resourceToken}'
  location: location
  tags: tags
  properties: {
    addressSpace: {
      addressPrefixes: [
        addressPrefix
      ]
    }
    subnets: [
      {
        name: appSubnetName
        properties: {
          addressPrefix: appSubnetPrefix
          delegations: [
            {
              name: 'flex-consumption'
              properties: {
                serviceName: 'Microsoft.App/environments'
              }
            }
          ]
        }
      }
      {
        name: endpointSubnetName
        properties: {
          addressPrefix: endpointSubnetPrefix
          privateEndpointNetworkPolicies: 'Disabled'
        }
      }
    ]
  }

  resource appSubnet 'subnets' existing = {
    name: appSubnetName
  }

  resource endpointSubnet 'subnets' existing = {
    name: endpointSubnetName
  }
}

resource zones 'Microsoft.Network/privateDnsZones@2024-06-01' = [for endpoint in endpoints: {
  name: endpoint.zone
  location: 'global'
  tags: tags
}]

resource zoneLinks 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2024-06-01' = [for (endpoint, i) in endpoints: {
  parent: zones[i]
  name: 'link-${resourceToken}'
  location: 'global'
  tags: tags
  properties: {
    registrationEnabled: false
    virtualNetwork: {
      id: vnet.id
    }
  }
}]

resource privateEndpoints 'Microsoft.Network/privateEndpoints@2025-09-01' = [for endpoint in endpoints: {
  name: 'pe-${resourceToken}-${endpoint.name}'
  location: location
  tags: tags
  properties: {
    subnet: {
      id: vnet::endpointSubnet.id
    }
    privateLinkServiceConnections: [
      {
        name: endpoint.name
        properties: {
          privateLinkServiceId: endpoint.target
          groupIds: [
            endpoint.groupId
          ]
        }
      }
    ]
  }
}]

resource zoneGroups 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2025-09-01' = [for (endpoint, i) in endpoints: {
  parent: privateEndpoints[i]
  name: 'default'
  properties: {
    privateDnsZoneConfigs: [
      {
        name: endpoint.name
        properties: {
          privateDnsZoneId: zones[i].id
        }
      }
    ]
  }
}]

output appSubnetId string = vnet::appSubnet.id
output vnetName string = vnet.name
