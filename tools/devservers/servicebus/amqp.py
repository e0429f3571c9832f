"""What the broker's AMQP classes share: the state kept per link, and proton helpers.

proton's Python wrapper objects are recreated per event, but attributes set on them live in the C
object's record, so per-link and per-delivery state is stored as attributes (``sb_info``,
``sb_token``). All of it is touched only on the reactor thread.
"""

from __future__ import annotations

import enum
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from proton import Condition, Delivery, Link, symbol

from devservers.servicebus.store import ReceivableEntity, SendTarget, Session, Topic

__all__ = [
    "INCOMING_CREDIT",
    "INTERNAL_ERROR",
    "Kind",
    "LinkInfo",
    "condition",
    "entity_path",
    "info_of",
    "new_delivery",
]

INTERNAL_ERROR = "amqp:internal-error"
INCOMING_CREDIT = 100  # granted to every link the client sends on, and topped up from half of it


class Kind(enum.Enum):
    """What a link is for, named from the client's side of it."""

    CBS_REQUESTS = "cbs-requests"
    CBS_REPLIES = "cbs-replies"
    MANAGEMENT_REQUESTS = "management-requests"
    MANAGEMENT_REPLIES = "management-replies"
    SEND = "send"  # the client sends to a queue or topic
    RECEIVE = "receive"  # the client receives from a queue, subscription or dead-letter queue


@dataclass(eq=False)
class LinkInfo:
    """Broker state of one attached link. For receivers it is also the owner of the locks they hold."""

    link_id: int
    connection_id: int
    kind: Kind
    name: str
    address: str
    target: SendTarget | None = None
    entity: ReceivableEntity | None = None
    node: ReceivableEntity | Topic | None = None
    peek_lock: bool = True
    wants_session: bool = False
    session: Session | None = None
    session_wait_deadline: float | None = None
    pending_replies: deque[bytes] = field(default_factory=deque)
    closed: bool = False


def entity_path(address: str | None) -> str:
    """``amqps://host:port/orders/$DeadLetterQueue`` -> ``orders/$DeadLetterQueue``; paths pass through."""
    if not address:
        return ""
    if "://" in address:
        address = address.split("://", 1)[1]
        address = address.split("/", 1)[1] if "/" in address else ""
    return address.strip("/")


def info_of(link: Link) -> LinkInfo | None:
    """The broker state of a link we accepted, or None (refused, or not yet attached)."""
    info = getattr(link, "sb_info", None)
    return info if isinstance(info, LinkInfo) else None


def new_delivery(link: Link, tag: bytes) -> Delivery:
    """A delivery with a binary tag (proton's annotation says str, but it takes bytes as they are)."""
    tag_any: Any = tag
    return link.delivery(tag_any)


def condition(name: str, description: str) -> Condition:
    """An AMQP error whose info map is never empty.

    The SDK reads a rejected send's error as ``[condition, description, info]`` by index, so the info
    field must be on the wire; proton leaves out an empty map (and the trailing null with it). Service
    Bus errors carry a tracking id there, so this does too.
    """
    return Condition(name, description, {symbol("com.microsoft:tracking-id"): str(uuid.uuid4())})
