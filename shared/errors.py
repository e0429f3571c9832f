"""One exception family for the core. Errors carry ids and hashes, never payloads.

    ConsumerError
    ├── ConfigurationError        a setting is missing or malformed
    ├── InvalidMessage            a delivery breaks a validation rule (``rule`` says which)
    ├── DownstreamUnavailable     an outgoing call timed out or could not connect: retry later
    ├── PublishError              an outgoing message could not be sent
    └── StoreError                the document store failed in a way the core must act on
        ├── AlreadyExists         a create found the id taken (409)
        ├── NotFound              a read found nothing (404)
        ├── PreconditionFailed    an etag or filter condition did not hold (412)
        ├── TransientStoreError   408/429/449/5xx, connection errors, timeouts: retry later
        ├── BatchFailed           one operation of a transactional batch failed; nothing was written
        └── BatchTooLarge         a transactional batch would break Cosmos DB's limits; never sent
"""

from __future__ import annotations


class ConsumerError(Exception):
    """Base of every error the core raises."""


class ConfigurationError(ConsumerError):
    """A setting is missing or has a value the app cannot use."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(f"setting {setting}: {problem}")
        self.setting = setting
        self.problem = problem


class InvalidMessage(ConsumerError):
    """A delivery breaks a validation rule; ``rule`` names the rule for the dead-letter description."""

    def __init__(self, rule: str) -> None:
        super().__init__(rule)
        self.rule = rule


class DownstreamUnavailable(ConsumerError):
    """An outgoing HTTP call timed out or could not connect; its outcome is unknown."""


class PublishError(ConsumerError):
    """An outgoing message could not be sent to its destination."""


class StoreError(ConsumerError):
    """The document store failed; ``status`` is the HTTP status where one exists."""

    def __init__(self, message: str, *, status: int | None = None, sub_status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.sub_status = sub_status


class AlreadyExists(StoreError):
    """A create found a document with the same id in the partition (409)."""


class NotFound(StoreError):
    """A point read found no document (404)."""


class PreconditionFailed(StoreError):
    """An etag or filter-predicate condition did not hold (412)."""


class TransientStoreError(StoreError):
    """The store may succeed if asked again later: throttled, timed out, unavailable."""


class BatchFailed(StoreError):
    """One operation of a transactional batch failed (``index``, ``status``); none of the batch was written."""

    def __init__(self, message: str, *, index: int, status: int | None, sub_status: int | None = None) -> None:
        super().__init__(message, status=status, sub_status=sub_status)
        self.index = index


class BatchTooLarge(StoreError):
    """A transactional batch would exceed 100 operations or 2 MB; it is refused, never split."""
