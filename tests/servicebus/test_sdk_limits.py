"""Message size as Service Bus limits it, sent with the SDK: the whole encoded message (for a batch, the whole
transfer) is at most 256 KB, or what a queue or topic sets in ``MaxMessageSizeInKilobytes``; a larger one is
refused with ``amqp:link:message-size-exceeded``, which the SDK raises as MessageSizeExceededError.

The SDK does not check a single message against the link's size, so the broker's refusal is what the tests
see. Batches it does check, so the tests build theirs with a larger limit of their own, as a client that
does not check would send them. Sizes are the SDK's own: ``encoded_size`` reads them from its batch
accounting, so "exactly the limit" means what the SDK puts on the wire.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage, ServiceBusMessageBatch, ServiceBusReceiveMode
from azure.servicebus.exceptions import MessageSizeExceededError
from proton.utils import BlockingConnection

from devservers.servicebus import Broker
from tests.servicebus.conftest import Handlers, collect, opened

KB = 1024
STANDARD = 256 * KB
BATCH_LIMIT = 1024 * KB  # Service Bus's largest batch, whatever an entity's message size
DATA_SECTION = 8  # what a message of 256 bytes or more adds to a batch besides itself (the SDK's figure)
RECEIVE_AND_DELETE = ServiceBusReceiveMode.RECEIVE_AND_DELETE


def encoded_size(message: ServiceBusMessage) -> int:
    """The bytes the SDK encodes ``message`` in, as its batch accounting counts them."""
    batch = ServiceBusMessageBatch(max_size_in_bytes=200 * 1024 * KB)
    empty = batch.size_in_bytes
    batch.add_message(message)
    return batch.size_in_bytes - empty - DATA_SECTION


def message_of_size(size: int, **fields: Any) -> ServiceBusMessage:
    """A message of ``x`` bytes that the SDK encodes in exactly ``size`` bytes, header and properties included."""
    probe = 4 * KB
    overhead = encoded_size(ServiceBusMessage(b"x" * probe, **fields)) - probe
    return ServiceBusMessage(b"x" * (size - overhead), **fields)


def unchecked_batch(*messages: ServiceBusMessage) -> ServiceBusMessageBatch:
    """A batch the SDK lets grow past the link's size: what a client that does not check would send."""
    batch = ServiceBusMessageBatch(max_size_in_bytes=16 * 1024 * KB)
    for message in messages:
        batch.add_message(message)
    return batch


def body_size(message: Any) -> int:
    return sum(len(section) for section in message.body)


def assert_at_limit_delivered_and_one_more_refused(sb: Handlers, queue: str, limit: int) -> None:
    with opened(sb.sender(queue), sb.receiver(queue, receive_mode=RECEIVE_AND_DELETE)) as (sender, receiver):
        with pytest.raises(MessageSizeExceededError, match=rf"size:{limit + 1} bytes.*limit \({limit} bytes\)"):
            sender.send_messages(message_of_size(limit + 1))
        at_limit = message_of_size(limit)
        sender.send_messages(at_limit)
        [delivered] = collect(receiver, 1, wait=10)
    assert body_size(delivered) == body_size(at_limit)
    assert delivered.sequence_number == 1  # the refused message was never enqueued


def test_a_message_of_exactly_256_kb_is_delivered_and_one_byte_more_is_refused(sb: Handlers) -> None:
    assert_at_limit_delivered_and_one_more_refused(sb, "size-standard", STANDARD)


def test_a_queue_with_max_message_size_in_kilobytes_takes_exactly_that_much(sb: Handlers) -> None:
    assert_at_limit_delivered_and_one_more_refused(sb, "size-premium", 1024 * KB)


def test_a_topic_with_max_message_size_in_kilobytes_takes_exactly_that_much(sb: Handlers) -> None:
    limit = 1024 * KB
    handlers = sb.topic_sender("size-topic"), sb.subscription("size-topic", "all", receive_mode=RECEIVE_AND_DELETE)
    with opened(*handlers) as (sender, receiver):
        with pytest.raises(MessageSizeExceededError):
            sender.send_messages(message_of_size(limit + 1))
        sender.send_messages(message_of_size(limit))
        [delivered] = collect(receiver, 1, wait=10)
    assert delivered.sequence_number == 1


def test_a_256_kb_body_and_a_list_of_two_half_bodies_raise_message_size_exceeded(sb: Handlers) -> None:
    """What the SDK's own live test checks against Service Bus (test_queue_by_servicebus_client_fail_send_messages)."""
    with opened(sb.sender("size-sdk-test"), sb.receiver("size-sdk-test")) as (sender, receiver):
        with pytest.raises(MessageSizeExceededError):
            sender.send_messages(ServiceBusMessage("A" * STANDARD))  # refused by the broker
        half = "A" * (STANDARD // 2)
        with pytest.raises(MessageSizeExceededError):
            sender.send_messages([ServiceBusMessage(half), ServiceBusMessage(half)])  # refused by the SDK's batch
        assert receiver.peek_messages(5, sequence_number=1) == []


def test_a_batch_whose_total_passes_the_limit_is_refused_whole(sb: Handlers) -> None:
    with opened(sb.sender("size-batch"), sb.receiver("size-batch")) as (sender, receiver):
        batch = unchecked_batch(*(message_of_size(100 * KB) for _ in range(3)))
        with pytest.raises(MessageSizeExceededError, match=rf"limit \({STANDARD} bytes\)"):
            sender.send_messages(batch)
        assert receiver.peek_messages(5, sequence_number=1) == []


def test_a_batch_the_sdk_fills_to_the_limit_is_refused_for_its_envelope(sb: Handlers) -> None:
    """azure-servicebus 7.15 counts a batch's messages but not the batch's own envelope (the properties it
    copies from the first message, or a MessageId it makes up), so its fullest batch passes the link's size
    on the wire; Service Bus counts the whole transfer, and so does the broker."""
    with opened(sb.sender("size-full-batch"), sb.receiver("size-full-batch")) as (sender, receiver):
        batch = sender.create_message_batch()
        for _ in range(2):
            batch.add_message(message_of_size(STANDARD // 2 - DATA_SECTION))
        assert batch.size_in_bytes == batch.max_size_in_bytes == STANDARD
        with pytest.raises(MessageSizeExceededError, match=rf"limit \({STANDARD} bytes\)"):
            sender.send_messages(batch)
        assert receiver.peek_messages(5, sequence_number=1) == []


def test_an_entity_that_takes_large_messages_still_refuses_a_batch_over_1_mb(sb: Handlers) -> None:
    queue = "size-large-batch"
    with opened(sb.sender(queue), sb.receiver(queue, receive_mode=RECEIVE_AND_DELETE)) as (sender, receiver):
        with pytest.raises(MessageSizeExceededError, match=rf"limit \({BATCH_LIMIT} bytes\)"):
            sender.send_messages(unchecked_batch(*(message_of_size(400 * KB) for _ in range(3))))
        sender.send_messages(message_of_size(1536 * KB))  # alone, a message may be larger than any batch
        [delivered] = collect(receiver, 1, wait=10)
    assert delivered.sequence_number == 1


def test_a_scheduled_message_over_the_limit_is_refused(sb: Handlers) -> None:
    with opened(sb.sender("size-scheduled"), sb.receiver("size-scheduled")) as (sender, receiver):
        later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=5)
        with pytest.raises(MessageSizeExceededError):
            sender.schedule_messages(message_of_size(STANDARD + 1), later)
        assert receiver.peek_messages(5, sequence_number=1) == []


@pytest.fixture
def raw_connection(broker: Broker) -> Iterator[BlockingConnection]:
    """A plain proton client: it shows the attach as the broker answers it, which the SDK keeps to itself."""
    connection = BlockingConnection(f"amqp://{broker.host}:{broker.port}", timeout=10)
    yield connection
    connection.close()


@pytest.mark.parametrize(
    ("address", "size"),
    [
        ("size-standard", STANDARD),
        ("size-premium", 1024 * KB),
        ("size-topic", 1024 * KB),
        ("size-premium/$management", 1024 * KB),
    ],
)
def test_a_link_to_an_entity_advertises_its_max_message_size(
    raw_connection: BlockingConnection, address: str, size: int
) -> None:
    sender = raw_connection.create_sender(address)
    assert sender.link.remote_max_message_size == size
    sender.close()
