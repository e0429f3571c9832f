"""Request/response nodes: ``$cbs`` and ``<entity>/$management``, each a pair of links.

A request arrives on the client's sending link of the pair and its answer goes out on the client's
receiving link, matched by ``correlation-id``. The claims-based-security put-token over ``$cbs`` is
answered with ``status-code`` 200 whatever the token: this is a test peer, not an auth check.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from proton import Connection, Delivery, Disposition, Link, Message, symbol

from devservers.servicebus import management, requestlog
from devservers.servicebus.amqp import Kind, LinkInfo, entity_path, new_delivery
from devservers.servicebus.routing import LinkTable

__all__ = ["RequestResponder"]

log = logging.getLogger("devservers.servicebus")


class RequestResponder:
    """Answers requests to ``$cbs`` and ``$management`` on the reply link of the same connection."""

    def __init__(self, table: LinkTable) -> None:
        self._table = table

    def answer(self, connection: Connection, delivery: Delivery, info: LinkInfo, data: bytes) -> None:
        """Accept a request's transfer and send its answer, which carries the outcome."""
        delivery.update(Disposition.ACCEPTED)
        delivery.settle()
        if info.kind is Kind.CBS_REQUESTS:
            self._answer_cbs(connection, data)
        elif info.kind is Kind.MANAGEMENT_REQUESTS:
            self._answer_management(connection, info, data)

    @staticmethod
    def flush(link: Link, info: LinkInfo) -> None:
        """Send the replies waiting on a reply link, as far as its credit goes."""
        while info.pending_replies and link.credit > 0:
            delivery = new_delivery(link, uuid.uuid4().bytes)
            link.send(info.pending_replies.popleft())
            link.advance()
            delivery.settle()

    def _answer_cbs(self, connection: Connection, data: bytes) -> None:
        request = Message()
        request.decode(data)
        reply = Message(
            correlation_id=request.id,
            properties={"status-code": 200, "status-description": "OK"},
        )
        properties: dict[str, Any] = request.properties or {}
        requestlog.cbs(str(properties.get("name", "$cbs")), 200)
        self._reply(connection, Kind.CBS_REPLIES, "$cbs", reply)

    def _answer_management(self, connection: Connection, info: LinkInfo, data: bytes) -> None:
        assert info.node is not None
        request = Message()
        request.decode(data)
        properties: dict[str, Any] = request.properties or {}
        call = management.Request(
            operation=str(properties.get("operation", "")),
            body={str(k): v for k, v in request.body.items()} if isinstance(request.body, dict) else {},
            owner=self._associated_receiver(connection, request),
            now=time.time(),
        )
        response = management.handle(info.node, call)
        requestlog.management(call.operation, info.address, response.status_code, response.description)
        reply_to = entity_path(request.reply_to) if request.reply_to else info.address
        self._reply(connection, Kind.MANAGEMENT_REPLIES, reply_to, _management_reply(request, response))

    def _associated_receiver(self, connection: Connection, request: Message) -> LinkInfo | None:
        """The open receiver the request names in ``associated-link-name``, on the same connection."""
        properties: dict[str, Any] = request.properties or {}
        name = properties.get("associated-link-name")
        if name is None:
            return None
        for _, info in self._table.links_on(connection):
            if info.kind is Kind.RECEIVE and info.name == str(name) and not info.closed:
                return info
        return None

    def _reply(self, connection: Connection, kind: Kind, address: str | None, reply: Message) -> None:
        found = self._reply_link(connection, kind, address)
        if found is None:
            log.info("no %s link for a reply to %r; dropping it", kind.value, address)
            return
        link, info = found
        info.pending_replies.append(bytes(reply.encode()))
        self.flush(link, info)

    def _reply_link(self, connection: Connection, kind: Kind, address: str | None) -> tuple[Link, LinkInfo] | None:
        """The reply link at ``address``, or else any reply link of that kind on the connection."""
        fallback = None
        for link, info in self._table.links_on(connection):
            if info.kind is not kind or info.closed:
                continue
            if address is None or info.address.lower() == address.lower():
                return link, info
            fallback = fallback or (link, info)
        return fallback


def _management_reply(request: Message, response: management.Response) -> Message:
    properties: dict[str, Any] = {"statusCode": response.status_code, "statusDescription": response.description}
    if response.condition is not None:
        properties["errorCondition"] = symbol(response.condition)
    return Message(correlation_id=request.id, properties=properties, body=response.body)
