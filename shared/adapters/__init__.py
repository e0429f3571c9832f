"""Adapters: the real implementations of the ports (Cosmos DB, Service Bus, HTTP) and their in-memory fakes."""
