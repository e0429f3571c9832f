"""The domain: message models, document kinds, outcomes and derived keys. Pure: no I/O, no adapters."""
