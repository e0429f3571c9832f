"""The core of the idempotent consumer. It knows nothing of Azure Functions."""
