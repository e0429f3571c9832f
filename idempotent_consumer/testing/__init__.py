"""What a consumer's own tests need without Azure: the in-memory store and sender (``memory``)."""
