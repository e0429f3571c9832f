"""The Service Bus sender: client choice, message mapping, and settings that name what is missing."""

from __future__ import annotations

import asyncio

import pytest
from azure.identity.aio import DefaultAzureCredential

from idempotent_consumer.adapters.servicebus import credential_for, make_client, to_sdk
from idempotent_consumer.errors import ConfigurationError
from idempotent_consumer.ports.sender import OutgoingMessage
from shared.settings import Settings


def test_connection_string_is_used_locally_without_connecting(loop: asyncio.Runner) -> None:
    settings = Settings.from_env(
        {"ServiceBusConnection": "Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=k;SharedAccessKey=v;"
                                 "UseDevelopmentEmulator=true"}
    )
    client = make_client(settings)
    assert client.fully_qualified_namespace == "127.0.0.1:5672"
    loop.run(client.close())


def test_namespace_uses_managed_identity(loop: asyncio.Runner) -> None:
    settings = Settings.from_env({"ServiceBusConnection__fullyQualifiedNamespace": "ns.servicebus.windows.net"})
    credential = credential_for(settings)
    assert isinstance(credential, DefaultAzureCredential)  # the async one, as the async client needs
    client = make_client(settings, credential)
    assert client.fully_qualified_namespace == "ns.servicebus.windows.net"
    loop.run(client.close())
    loop.run(credential.close())


def test_missing_connection_names_both_settings() -> None:
    with pytest.raises(ConfigurationError, match="ServiceBusConnection__fullyQualifiedNamespace"):
        make_client(Settings.from_env({}))


def test_outgoing_message_maps_ids_and_properties() -> None:
    sdk = to_sdk(OutgoingMessage("m-1", b"{}", correlation_id="c-1", session_id="s-1", subject="OrderAccepted",
                                 application_properties={"type": "OrderAccepted"}))
    assert (sdk.message_id, sdk.correlation_id, sdk.session_id, sdk.subject) == ("m-1", "c-1", "s-1", "OrderAccepted")
    assert sdk.application_properties == {"type": "OrderAccepted"}
    assert sdk.content_type == "application/json"
