"""The Functions side of the protocol: the binding's message as the library's ``InboundMessage``, the settlement
port over the binding's message actions, and how long the host keeps a delivery's lock. The only part of the
library that imports the binding extension's types."""
