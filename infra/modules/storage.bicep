// Storage for the Functions host and the deployment package: no shared keys, TLS 1.2, no public blobs.
param location string
param tags object
param resourceToken string
@description('false: the account takes no traffic from the internet, only through its private endpoints (main.bicep\'s privateNetwork).')
param publicAccess bool = true

var deploymentContainerName = 'app-package'

resource account 'Microsoft.Storage/storageAccounts@2026-04-01' = {
  // checkov:skip=CKV_AZURE_35: public only with privateNetwork false (the default, for a first deploy): the host then reaches the account over its public endpoint, Entra ID only (allowSharedKeyAccess false); with it true, public access is disabled and the network rules deny
  // checkov:skip=CKV_AZURE_59: as above; anonymous blob access is off (allowBlobPublicAccess false) and keys are disabled
  // checkov:skip=CKV_AZURE_206: the account holds only host state and the deployment package, both recreated by a redeploy; LRS keeps idle cost lowest
  // checkov:skip=CKV_AZURE_43: the name is 'st' + uniqueString(): 15 lower-case letters and digits, which checkov cannot evaluate
  name: 'st${resourceToken}'
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    allowSharedKeyAccess: false
    allowBlobPublicAccess: false
    defaultToOAuthAuthentication: true
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    publicNetworkAccess: publicAccess ? 'Enabled' : 'Disabled'
    networkAcls: {
      defaultAction: publicAccess ? 'Allow' : 'Deny'
      bypass: 'None'
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2026-04-01' = {
  parent: account
  name: 'default'
  properties: {
    deleteRetentionPolicy: {
      enabled: true
      days: 7
    }
  }
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2026-04-01' = {
  parent: blobService
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

output name string = account.name
output deploymentContainerUrl string = '${account.properties.primaryEndpoints.blob}${deploymentContainerName}'
