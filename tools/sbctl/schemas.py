"""JSON Schemas of the messages, generated from the core's models, for producers to validate against.

The committed copies live in ``schemas/``; ``python -m sbctl schemas`` rewrites them, and a test fails
when they are stale. Rules that a schema cannot say (total = sum of the lines, a time-zone offset,
MessageId = orderId) are in each schema's descriptions and enforced by the consumer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from shared.domain.documents import OrderAccepted, OrderRejected
from shared.domain.lifecycle import KINDS, OrderCancelled, OrderShipped, PaymentCaptured
from shared.domain.orders import OrderPlaced

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "schemas"
MESSAGES: dict[str, type[Any]] = {
    "order-placed": OrderPlaced,
    "payment-captured": PaymentCaptured,
    "order-shipped": OrderShipped,
    "order-cancelled": OrderCancelled,
    "order-accepted": OrderAccepted,
    "order-rejected": OrderRejected,
}


def _ecma(node: Any) -> Any:
    """The schema with Python's end-of-text anchor ``\\Z`` spelled ``$``, as JSON Schema's regexes do."""
    if isinstance(node, dict):
        return {k: v.replace("\\Z", "$") if k == "pattern" else _ecma(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_ecma(v) for v in node]
    return node


def schema(model: type[Any]) -> dict[str, Any]:
    """One message's JSON Schema (2020-12); an event's ``type`` is pinned to its own name."""
    generated = _ecma(msgspec.json.schema(model))
    for type_name, kind in KINDS.items():
        if kind.model is model:
            generated["$defs"][model.__name__]["properties"]["type"]["const"] = type_name
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **generated}


def rendered() -> dict[str, str]:
    """Each message's schema file name and text (sorted keys, trailing newline)."""
    return {
        f"{name}.schema.json": json.dumps(schema(model), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        for name, model in MESSAGES.items()
    }


def write(directory: Path = DEFAULT_DIR) -> list[Path]:
    """Write every schema into ``directory``; return the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in rendered().items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
