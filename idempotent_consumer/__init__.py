"""Effectively-once processing for Service Bus-triggered Azure Functions, on Azure Cosmos DB.

Service Bus delivers at least once. This library turns that into effectively-once results: the create of a
message's record is both the duplicate check and the write, in one transactional batch with the documents the
message writes; calls that cannot join that batch run under a two-phase record with a lease; outgoing
messages wait in an outbox, written in the same batch. The order app beside it (``function_app.py``) is its
first user.

    plan         what a handler declares (Plan, Send, Effect), and the intake that writes it in one batch
    ordered      ordered processing by a state machine the consumer supplies: parking, release, operator commands
    settings     settings as declarations, read under a consumer's prefix; the retention rule
    runtime      one consumer's settings, ports and breakers, and the delivery policy over them
    http         an effect's JSON POST under an idempotency key, answered as a Reply
    errors       every error the protocol raises, by what the delivery does with it
    identity     every derived id and key, labelled by (consumer, name, key), and the request hash
    messages     InboundMessage, the transport-neutral view of a delivery
    outcomes     the one vocabulary: an Outcome, a Result, and whether a status is transient
    records      the protocol's own stored records (outbox entry, side-effect record, inbox marker...)
    retries      a delayed retry's copy: its chain's properties, back-off and total limit
    breaker      the circuit breaker a queue's deliveries share
    delivery     one delivery from trigger to settlement: attempts inside the lock, hand-on, settlement
    telemetry    one log record and one counter per delivery: ids, hashes and outcomes, never payloads
    side_effects the two-phase record (claim, lease, takeover, finish) around a call that cannot join a batch
    outbox       the outbox's publisher: change-feed batches and the sweep
    reports      what waits too long: events parked, side effects stuck in progress
    ports        the document store, the sender, and what an attempt reached of them
    adapters     the store over Cosmos DB, the sender over Service Bus, the app's identity
    testing      the in-memory store and sender, for a consumer's own tests
    functions    the Consumer blueprint; the binding's message, the settlement port over its actions, the lock's
                 renewal (host.json)

It never imports the app that uses it (``tests/unit/test_layering.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from idempotent_consumer.plan import Answer, Effect, Plan, Scope, Send

__all__ = ["Answer", "Effect", "Plan", "Scope", "Send", "__version__"]
__version__ = "0.1.0"
_PLAN = frozenset({"Answer", "Effect", "Plan", "Scope", "Send"})


def __getattr__(name: str) -> Any:
    """The plan's names, imported on first use: a consumer that declares no plan (the order app) never pays for
    the module."""
    if name in _PLAN:
        from idempotent_consumer import plan  # noqa: PLC0415

        return getattr(plan, name)
    raise AttributeError(f"module 'idempotent_consumer' has no attribute {name!r}")
