"""Ordered processing, an opt-in mode: events applied to their subject exactly once and in sequence, by a state
machine the consumer supplies (``Machine``); an event before its turn is parked, and released in the batch of the
event that makes it next. The order app's lifecycle events are its first user (``shared.domain.aggregate``)."""

from idempotent_consumer.ordered.apply import Ordered
from idempotent_consumer.ordered.machine import Machine, OrderedEvent, Release, Step, StoredState, Subject, transition

__all__ = ["Machine", "Ordered", "OrderedEvent", "Release", "Step", "StoredState", "Subject", "transition"]
