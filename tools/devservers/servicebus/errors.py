"""Service Bus errors: the AMQP conditions the SDK maps to its exceptions, and the error that carries them."""

from __future__ import annotations

__all__ = [
    "ARGUMENT_ERROR",
    "ARGUMENT_OUT_OF_RANGE",
    "MESSAGE_LOCK_LOST",
    "MESSAGE_NOT_FOUND",
    "MESSAGE_SIZE_EXCEEDED",
    "NOT_ALLOWED",
    "NOT_FOUND",
    "NOT_IMPLEMENTED",
    "SESSION_CANNOT_BE_LOCKED",
    "SESSION_LOCK_LOST",
    "TIMEOUT",
    "BrokerError",
    "message_size_exceeded",
    "session_lock_lost",
]

# Service Bus error conditions the SDK maps to its exceptions (azure/servicebus/_transport/_pyamqp_transport.py).
NOT_FOUND = "amqp:not-found"
NOT_ALLOWED = "amqp:not-allowed"
NOT_IMPLEMENTED = "amqp:not-implemented"
MESSAGE_LOCK_LOST = "com.microsoft:message-lock-lost"
SESSION_LOCK_LOST = "com.microsoft:session-lock-lost"
SESSION_CANNOT_BE_LOCKED = "com.microsoft:session-cannot-be-locked"
MESSAGE_NOT_FOUND = "com.microsoft:message-not-found"
ARGUMENT_ERROR = "com.microsoft:argument-error"
ARGUMENT_OUT_OF_RANGE = "com.microsoft:argument-out-of-range"
TIMEOUT = "com.microsoft:timeout"
MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"  # AMQP's own condition, as Service Bus sends it


class BrokerError(Exception):
    """A request Service Bus would refuse, with the AMQP condition and the management status code."""

    def __init__(self, condition: str, description: str, status_code: int = 400) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description
        self.status_code = status_code


def session_lock_lost(session_id: str) -> BrokerError:
    """The error for a session whose lock ended (or was never held)."""
    return BrokerError(
        SESSION_LOCK_LOST,
        f"The session lock has expired on the MessageSession '{session_id}'. Accept a new MessageSession.",
        410,
    )


def message_size_exceeded(size: int, limit: int, path: str) -> BrokerError:
    """The error for a message (or batch) larger than its entity takes, worded as Service Bus words it."""
    return BrokerError(
        MESSAGE_SIZE_EXCEEDED,
        f"The received message (size:{size} bytes) exceeds the limit ({limit} bytes) currently allowed on '{path}'.",
    )
