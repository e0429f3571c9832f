"""The ports over Azure: the store over Cosmos DB, the sender over Service Bus, and the app's identity."""
