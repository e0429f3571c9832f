// The Functions app on Flex Consumption (Linux, Python) with a system-assigned managed identity.
param location string
param tags object
param resourceToken string
param pythonVersion string
param storageAccountName string
param deploymentContainerUrl string
param applicationInsightsConnectionString string
@description('The subnet the app is integrated into (delegated to Microsoft.App/environments); empty: none.')
param virtualNetworkSubnetId string = ''

@description('The settings the code reads, identity-based; merged with the host settings below.')
param appSettings object

resource plan 'Microsoft.Web/serverfarms@2025-03-01' = {
  // checkov:skip=CKV_AZURE_225: Flex Consumption scales per event and zone redundancy is not offered in every region; enable it per region where needed
  name: 'plan-${resourceToken}'
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    tier: 'FlexConsumption'
    name: 'FC1'
  }
  properties: {
    reserved: true
  }
}

resource site 'Microsoft.Web/sites@2025-03-01' = {
  // checkov:skip=CKV_AZURE_222: the app has no HTTP triggers; the public endpoint serves only deployment (func publish, azd deploy)
  // checkov:skip=CKV_AZURE_17: no HTTP-triggered functions, so there is no client request to authenticate with a certificate
  // checkov:skip=CKV_AZURE_212: Flex Consumption scales from zero per queue and change-feed load; failover is the platform's
  // checkov:skip=CKV_AZURE_213: no HTTP endpoint to probe; trigger health shows in Application Insights
  // checkov:skip=CKV_AZURE_78: Flex Consumption refuses siteConfig.ftpsState (ARM BadRequest 51021) and has no FTP endpoint
  // checkov:skip=CKV_AZURE_18: siteConfig.http20Enabled is not a Flex Consumption setting; the app serves no HTTP traffic
  // checkov:skip=CKV_AZURE_67: as CKV_AZURE_18, for function apps
  name: 'func-${resourceToken}'
  location: location
  tags: union(tags, {
    'azd-service-name': 'consumer'
  })
  kind: 'functionapp,linux'
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    // On Flex Consumption an integrated app sends all its outbound traffic through the network.
    virtualNetworkSubnetId: empty(virtualNetworkSubnetId) ? null : virtualNetworkSubnetId
    // Flex Consumption refuses siteConfig.ftpsState (ARM BadRequest 51021) and does not document http20Enabled: both are
    // left out (tests/infra/flex_consumption.py lists what Flex refuses or ignores, with the sources). Flex has no FTP
    // endpoint to disable: deployment goes to the blob container below.
    siteConfig: {
      minTlsVersion: '1.2'
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: deploymentContainerUrl
          authentication: {
            type: 'SystemAssignedIdentity'
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: 40
        instanceMemoryMB: 2048
      }
      runtime: {
        name: 'python'
        version: pythonVersion
      }
    }
  }

  resource settings 'config' = {
    // checkov:skip=CKV_AZURE_66: this is the appsettings resource, not the web config checkov's App Service rules assume
    // checkov:skip=CKV_AZURE_63: as above; logs go to Application Insights
    // checkov:skip=CKV_AZURE_222: as above; public network access is a property of the site
    // checkov:skip=CKV_AZURE_80: as above; the app runs Python, not .NET
    // checkov:skip=CKV_AZURE_13: as above; there are no HTTP triggers to authenticate
    // checkov:skip=CKV_AZURE_88: as above; Flex Consumption deploys from blob storage, not Azure Files
    // checkov:skip=CKV_AZURE_65: as above; failures are logged to Application Insights
    name: 'appsettings'
    properties: union(appSettings, {
      AzureWebJobsStorage__accountName: storageAccountName
      APPLICATIONINSIGHTS_CONNECTION_STRING: applicationInsightsConnectionString
      APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'Authorization=AAD'
    })
  }
}

output name string = site.name
output principalId string = site.identity.principalId
