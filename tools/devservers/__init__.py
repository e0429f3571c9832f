"""Local stand-in servers for tests and workstation runs; not deployed.

Each subpackage starts a local substitute for a cloud service that cannot run here (for example
``devservers.cosmos`` for Azure Cosmos DB, ``devservers.servicebus`` for Service Bus, ``devservers.fulfilment``
for the warehouse service) so that tests and ``func start`` on a workstation can use
the real client SDKs against it.
"""
