"""The Functions side of the protocol: the ``Consumer`` blueprint (``consumer``), the binding's message as the
library's ``InboundMessage``, the settlement port over the binding's message actions, and how long the host keeps a
delivery's lock. The only part of the library that imports the binding extension's types.

``Consumer`` and ``Context`` are imported from here on first use, so that an app importing one of the other
modules does not load the blueprint's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from idempotent_consumer.functions.consumer import Consumer, Context

__all__ = ["Consumer", "Context"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from idempotent_consumer.functions import consumer  # noqa: PLC0415 - see the docstring

        return getattr(consumer, name)
    raise AttributeError(name)
