"""One exception family for the core. Errors carry ids, hashes and rules, never payloads.

    ConsumerError
    ├── ConfigurationError        settings missing or malformed (``problems`` names each)
    ├── InvalidMessage            a delivery breaks a validation rule (``rule`` names it with its field path)
    ├── DownstreamUnavailable     an outgoing call timed out or could not connect: retry later
    ├── PublishError              an outgoing message could not be sent
    ├── LimitExceeded             a message or a write would pass a limit of the platform or of this app (``limit``
    │                             names it): it can never succeed as it is
    ├── UnreadableDocument        a stored document does not decode under this version's model (``doc_id``,
    │                             ``schema_version``, ``request_hash`` when that much reads)
    └── StoreError                the document store failed in a way the core must act on
        ├── AlreadyExists         a create found the id taken
        ├── NotFound              a read or patch found no document
        ├── PreconditionFailed    an etag or filter condition did not hold
        ├── TransientStoreError   throttled, timed out, unavailable: retry later
        ├── BatchFailed           one operation of a transactional batch failed (``index``, ``error``); nothing written
        ├── BatchTooLarge         a transactional batch would break Cosmos DB's limits; never sent
        └── WriteConflict         a named write found its partition other than it assumed; nothing written
            ├── OrderIdTaken      a document already holds the order's id
            ├── AlreadySeen       this consumer's marker for the event exists (``stored_hash``: its first content's,
            │                     None when that does not read here; ``releasing``: its release took more batches)
            ├── OrderChanged      the order, or a document the write relied on, changed since it was read
            └── NoLongerAllowed   a document an effect relies on is no longer in a state that allows it
                                  (``document``: as read), an order closed before its reservation, say

The named writes (``idempotent_consumer.ordered.writes``) raise the conflicts, so that no handler reads a batch's
positions. Adapters translate their SDK's errors into this family where they occur, chained with ``from``. The
handlers decide on the error types alone; ``status`` is kept for logs and never compared by the core.
"""

from __future__ import annotations


class ConsumerError(Exception):
    """Base of every error the core raises."""


class ConfigurationError(ConsumerError):
    """A setting is missing or has a value the app cannot use; ``problems`` lists every one found, each setting
    with its problem, when there were several (``setting`` and ``problem`` are the first's)."""

    def __init__(self, setting: str, problem: str, *, more: tuple[tuple[str, str], ...] = ()) -> None:
        self.problems = ((setting, problem), *more)
        super().__init__(f"setting {setting}: {problem}" if not more else
                         f"{len(self.problems)} settings: " + "; ".join(f"{s}: {p}" for s, p in self.problems))
        self.setting = setting
        self.problem = problem

    @classmethod
    def of(cls, problems: list[tuple[str, str]]) -> ConfigurationError:
        """One error naming every setting in ``problems`` (at least one) and what is wrong with each."""
        (setting, problem), *more = problems
        return cls(setting, problem, more=tuple(more))


class InvalidMessage(ConsumerError):
    """A delivery breaks a validation rule; ``rule`` names the rule and its field path, never a value."""

    def __init__(self, rule: str) -> None:
        super().__init__(rule)
        self.rule = rule


class DownstreamUnavailable(ConsumerError):
    """An outgoing HTTP call timed out or could not connect; its outcome is unknown.

    ``slow``: the service took the request and did not answer in time (a read timeout), so it is up and may
    still be doing the work; not a sign of an outage. An unreachable service, a refused or dropped connection
    or an answer that is not HTTP are not slow."""

    def __init__(self, message: str, *, slow: bool = False) -> None:
        super().__init__(message)
        self.slow = slow


class PublishError(ConsumerError):
    """An outgoing message could not be sent to its destination."""


class LimitExceeded(ConsumerError):
    """A message or a write would pass a limit of the platform or of this app; ``limit`` names it with its value
    (such as "Cosmos DB's 2 MB transactional batch"). Retrying cannot help."""

    def __init__(self, message: str, *, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


class UnreadableDocument(ConsumerError):
    """A stored document does not decode under this version's model: a newer version broke the additive
    rule (docs/design.md, "Schema versions"), or the document is not ours. It names the rule, never a value."""

    def __init__(self, message: str, *, doc_id: str, schema_version: int | None,
                 request_hash: str | None = None) -> None:
        super().__init__(message)
        self.doc_id = doc_id
        self.schema_version = schema_version
        self.request_hash = request_hash


class StoreError(ConsumerError):
    """The document store failed; ``status`` is the HTTP status where one exists, for logs only."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AlreadyExists(StoreError):
    """A create found a document with the same id in the partition."""


class NotFound(StoreError):
    """A point read or a patch found no document."""


class PreconditionFailed(StoreError):
    """An etag or filter-predicate condition did not hold."""


class TransientStoreError(StoreError):
    """The store may succeed if asked again later: throttled, timed out, unavailable."""


class BatchFailed(StoreError):
    """Operation ``index`` of a transactional batch failed with ``error``; none of the batch was written."""

    def __init__(self, index: int, error: StoreError) -> None:
        super().__init__(f"batch operation {index} failed: {error}", status=error.status)
        self.index = index
        self.error = error


class BatchTooLarge(StoreError):
    """A transactional batch would exceed 100 operations or 2 MB, or hold an item over 2 MB; it is refused, never
    split (the named writes plan their batches so that it is not met). ``limit`` names the limit."""

    def __init__(self, message: str, *, limit: str, status: int | None = None) -> None:
        super().__init__(message, status=status)
        self.limit = limit


class WriteConflict(StoreError):
    """A named write found its partition other than it assumed; none of it was written."""


class OrderIdTaken(WriteConflict):
    """A document already holds the order's id: the same order, another content, or a foreign document."""


class NoLongerAllowed(WriteConflict):
    """A document a side effect relies on is no longer in a state that allows the effect, or its announcement (a
    cancelled order's reservation, say); ``document`` is that document as read."""

    def __init__(self, message: str, document: dict[str, object]) -> None:
        super().__init__(message)
        self.document = document


class AlreadySeen(WriteConflict):
    """This consumer already wrote its marker for the event; ``stored_hash`` is the first content's requestHash,
    None when the marker (or parked copy) does not decode here and that field does not read either."""

    def __init__(self, message: str, stored_hash: str | None, *, releasing: bool = False) -> None:
        super().__init__(message, status=409)
        self.stored_hash = stored_hash
        self.releasing = releasing  # the marker's batch began a release that took more batches than one


class OrderChanged(WriteConflict):
    """The order, or a document the write relied on, changed or vanished since it was read: read it again."""
