"""The azure-servicebus adapter of the sender port, over ``azure.servicebus.aio``.

Clients are made lazily, once per process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any, Protocol

from azure.core.exceptions import AzureError
from azure.servicebus import ServiceBusMessage
from azure.servicebus.aio import ServiceBusClient
from azure.servicebus.exceptions import MessageSizeExceededError, ServiceBusError

from idempotent_consumer.adapters.credentials import managed_identity, token_failure
from idempotent_consumer.errors import ConfigurationError, PublishError
from idempotent_consumer.ports.sender import OutgoingMessage


class ServiceBusSettings(Protocol):
    """What the Service Bus adapter reads of a consumer's settings: the local connection string, or the
    namespace reached with the app's identity."""

    @property
    def servicebus_connection(self) -> str | None: ...
    @property
    def servicebus_namespace(self) -> str | None: ...


def credential_for(settings: ServiceBusSettings) -> Any:
    """None with a connection string (local emulators only), else the app's identity
    (``credentials.managed_identity``) for the namespace."""
    if settings.servicebus_connection:
        return None
    if not settings.servicebus_namespace:
        raise ConfigurationError(
            "ServiceBusConnection__fullyQualifiedNamespace", "is required (or ServiceBusConnection for local emulators)"
        )
    return managed_identity()


def make_client(settings: ServiceBusSettings, credential: Any = None) -> ServiceBusClient:
    """A client from the local connection string, or for the namespace with managed identity:
    ``credential``, made by a caller that closes it (the client does not), or a new one."""
    credential = credential or credential_for(settings)
    if credential is None:
        return ServiceBusClient.from_connection_string(str(settings.servicebus_connection))
    return ServiceBusClient(fully_qualified_namespace=str(settings.servicebus_namespace), credential=credential)


def to_sdk(message: OutgoingMessage) -> ServiceBusMessage:
    """The SDK message, every field of ``message`` carried over."""
    properties: dict[str | bytes, Any] = {k: v for k, v in message.application_properties.items()}
    return ServiceBusMessage(
        message.body,
        message_id=message.message_id,
        correlation_id=message.correlation_id,
        session_id=message.session_id,
        subject=message.subject,
        content_type=message.content_type,
        application_properties=properties,
        scheduled_enqueue_time_utc=message.scheduled_enqueue_time,
        reply_to=message.reply_to,
        to=message.to,
        time_to_live=message.time_to_live,
    )


class ServiceBusSender:
    """Sends through one ServiceBusClient; a sender link per destination, opened on first use."""

    @classmethod
    def from_settings(cls, settings: ServiceBusSettings) -> ServiceBusSender:
        """A sender over its own client and credential, both closed by ``close``."""
        credential = credential_for(settings)
        return cls(make_client(settings, credential), credential)

    def __init__(self, client: ServiceBusClient, credential: Any = None) -> None:
        self._client = client
        self._credential = credential  # made with the client, closed after it by ``close``
        self._senders: dict[str, Any] = {}
        self._lock = asyncio.Lock()  # one send at a time per process: a link is opened once, then reused

    async def send(self, destination: str, messages: Sequence[OutgoingMessage]) -> None:
        """Send the messages in as few batch calls as fit the link's batch size; SDK errors become PublishError.

        Each batch is one request on the wire. A failure after the first batch leaves the earlier ones sent,
        which the port allows: resends carry the same MessageIds.
        """
        if not messages:
            return
        async with self._lock:
            try:
                sender = self._senders.get(destination)
                if sender is None:
                    sender = self._client.get_queue_sender(queue_name=destination)
                    self._senders[destination] = sender
                for batch in await _batches(sender, messages):
                    await sender.send_messages(batch)
            except (ServiceBusError, AzureError) as exc:
                if (failed := self._senders.pop(destination, None)) is not None:
                    await _close_quietly(failed)
                failure = token_failure(exc)
                why = f"; the app's identity: {failure.value}" if failure is not None else ""
                raise PublishError(f"send to {destination} failed: {type(exc).__name__}{why}") from exc

    async def close(self) -> None:
        """Close the links and the client."""
        async with self._lock:
            for sender in self._senders.values():
                await _close_quietly(sender)
            self._senders.clear()
        await self._client.close()
        credential, self._credential = self._credential, None
        if credential is not None:
            await credential.close()


# What a batch adds on the wire to the messages the SDK counts: azure-servicebus 7.15 counts neither the
# batch's envelope nor the first message's properties that it copies onto it (its MessageId, up to 128
# characters, and SessionId), 21 to about 300 bytes, and a batch that passes the entity's size is refused
# whole (MessageSizeExceeded). The .NET SDK reserves room for them; so does this adapter.
BATCH_ENVELOPE_BYTES = 1024


async def _batches(sender: Any, messages: Sequence[OutgoingMessage]) -> list[Any]:
    """The messages in ServiceBusMessageBatch objects, each filled up to the link's maximum message size less
    the batch's envelope (BATCH_ENVELOPE_BYTES)."""
    limit = (await sender.create_message_batch()).max_size_in_bytes - BATCH_ENVELOPE_BYTES
    batches = [await sender.create_message_batch(max_size_in_bytes=limit)]
    for message in messages:
        sdk_message = to_sdk(message)
        try:
            batches[-1].add_message(sdk_message)
        except MessageSizeExceededError:
            if len(batches[-1]) == 0:
                raise  # one message larger than a batch: the send fails, and the caller leaves it pending
            batches.append(await sender.create_message_batch(max_size_in_bytes=limit))
            batches[-1].add_message(sdk_message)
    return batches


async def _close_quietly(sender: Any) -> None:
    # A link that failed may fail to close too; it is dropped either way.
    with contextlib.suppress(ServiceBusError, AzureError, OSError):
        await sender.close()
