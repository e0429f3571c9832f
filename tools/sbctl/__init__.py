"""sbctl: operator tools for the idempotent consumer's queues: send test traffic, inspect and repair the DLQ.

Works alike against the local broker (devservers.servicebus), the official emulator and Azure.
"""
