"""One contract for every MessageSender: the recording fake and the azure-servicebus adapter on the
local broker. Both model the destination's duplicate detection, so what a test reads back is what a
consumer of the destination would see.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypedDict, Unpack

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode

from devservers.servicebus import Broker, start_broker
from idempotent_consumer.adapters.servicebus import ServiceBusSender, make_client
from idempotent_consumer.errors import PublishError
from idempotent_consumer.ports.sender import MessageSender, OutgoingMessage
from idempotent_consumer.testing.memory import RecordingSender
from shared.settings import Settings

QUEUE = "contract"
WINDOW_SECONDS = 1
CONFIG = {"UserConfig": {"Namespaces": [{"Name": "contract", "Queues": [
    {"Name": QUEUE, "Properties": {"RequiresDuplicateDetection": True,
                                   "DuplicateDetectionHistoryTimeWindow": f"PT{WINDOW_SECONDS}S"}},
], "Topics": []}]}}


@dataclass
class Destination:
    """A sender, what reached the destination queue, and how to let time pass for its detection window."""

    sender: MessageSender
    read: Callable[[], list[OutgoingMessage]]
    wait: Callable[[float], None]
    seen: list[OutgoingMessage] = field(default_factory=list)

    def delivered(self) -> list[OutgoingMessage]:
        self.seen.extend(self.read())
        return list(self.seen)


@pytest.fixture(scope="module")
def broker() -> Iterator[Broker]:
    with start_broker(CONFIG) as running:
        yield running


@pytest.fixture(scope="module")
def broker_client(broker: Broker) -> Iterator[ServiceBusClient]:
    """The test's own (sync) client, which reads what reached the queue."""
    with ServiceBusClient.from_connection_string(broker.connection_string) as client:
        yield client


def _received(client: ServiceBusClient) -> list[OutgoingMessage]:
    # ReceiveAndDelete: reading what arrived needs no lock, which a loaded machine's drain of thousands could outlast.
    with client.get_queue_receiver(QUEUE, max_wait_time=1, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE) \
            as receiver:
        found = []
        while batch := receiver.receive_messages(max_message_count=50, max_wait_time=0.5):
            for message in batch:
                found.append(OutgoingMessage(
                    message_id=str(message.message_id), body=b"".join(message.body),
                    correlation_id=message.correlation_id, session_id=message.session_id, subject=message.subject,
                    content_type=str(message.content_type),
                    application_properties={k.decode() if isinstance(k, bytes) else str(k):
                                            v.decode() if isinstance(v, bytes) else str(v)
                                            for k, v in (message.application_properties or {}).items()},
                ))
        return found


@pytest.fixture(params=["recording", "servicebus"])
def destination(request: pytest.FixtureRequest, loop: asyncio.Runner) -> Iterator[Destination]:
    if request.param == "recording":
        now = [time.time()]
        fake = RecordingSender(detection_window_seconds=WINDOW_SECONDS, clock=lambda: now[0], destinations={QUEUE})

        def advance(seconds: float) -> None:
            now[0] += seconds

        def read() -> list[OutgoingMessage]:
            fake.release_due()
            found = [m for d, m in fake.delivered if d == QUEUE]
            fake.delivered.clear()
            return found

        yield Destination(fake, read, advance)
        return
    client: ServiceBusClient = request.getfixturevalue("broker_client")
    _received(client)  # drain what an earlier test left
    broker: Broker = request.getfixturevalue("broker")
    sender = ServiceBusSender(make_client(Settings(servicebus_connection=broker.connection_string)))
    yield Destination(sender, lambda: _received(client), time.sleep)
    loop.run(sender.close())


class MessageFields(TypedDict, total=False):
    """The optional fields of an OutgoingMessage."""

    correlation_id: str | None
    session_id: str | None
    subject: str | None
    content_type: str
    application_properties: Mapping[str, str]


def message(message_id: str | None = None, **fields: Unpack[MessageFields]) -> OutgoingMessage:
    return OutgoingMessage(message_id=message_id or f"m-{uuid.uuid4()}", body=b'{"orderId":"o-1"}', **fields)


def test_a_message_arrives_with_its_ids_subject_and_properties(destination: Destination, loop: asyncio.Runner) -> None:
    sent = message(correlation_id="c-1", subject="OrderAccepted", application_properties={"type": "OrderAccepted"})
    loop.run(destination.sender.send(QUEUE, [sent]))
    assert destination.delivered() == [sent]


def test_a_batch_arrives_whole_and_in_order(destination: Destination, loop: asyncio.Runner) -> None:
    batch = [message() for _ in range(5)]
    loop.run(destination.sender.send(QUEUE, batch))
    assert [m.message_id for m in destination.delivered()] == [m.message_id for m in batch]


def test_a_send_larger_than_one_batch_arrives_whole_and_in_order(destination: Destination,
                                                                 loop: asyncio.Runner) -> None:
    # 300 messages of 2 KB: more than a 256 KB batch (Service Bus Standard's message size), so the adapter
    # splits the send into batches of what the link takes.
    batch = [OutgoingMessage(message_id=f"m-{uuid.uuid4()}", body=b"x" * 2048) for _ in range(300)]
    loop.run(destination.sender.send(QUEUE, batch))
    assert [m.message_id for m in destination.delivered()] == [m.message_id for m in batch]


@pytest.mark.parametrize("body_bytes", [40, 90, 200])
def test_a_send_whose_batches_are_filled_to_the_limit_arrives_whole(
    destination: Destination, loop: asyncio.Runner, body_bytes: int
) -> None:
    # Small messages fill a batch to within a few bytes of 256 KB, and a batch on the wire is more than its
    # messages: the first message's MessageId copied onto it, its envelope. A batch filled to the SDK's own
    # count is refused (MessageSizeExceeded), so the adapter leaves room for it.
    batch = [OutgoingMessage(message_id="m" * 120 + f"{n:06d}", body=b"x" * body_bytes) for n in range(2500)]
    loop.run(destination.sender.send(QUEUE, batch))
    assert len(destination.delivered()) == len(batch)


def test_a_resend_inside_the_detection_window_is_dropped(destination: Destination, loop: asyncio.Runner) -> None:
    first = message()
    loop.run(destination.sender.send(QUEUE, [first]))
    loop.run(destination.sender.send(QUEUE, [first]))
    assert [m.message_id for m in destination.delivered()] == [first.message_id]


def test_a_resend_after_the_window_arrives_again(destination: Destination, loop: asyncio.Runner) -> None:
    first = message()
    loop.run(destination.sender.send(QUEUE, [first]))
    destination.wait(WINDOW_SECONDS + 0.5)
    loop.run(destination.sender.send(QUEUE, [first]))
    assert [m.message_id for m in destination.delivered()] == [first.message_id] * 2


def test_sending_nothing_sends_nothing(destination: Destination, loop: asyncio.Runner) -> None:
    loop.run(destination.sender.send(QUEUE, []))
    assert destination.delivered() == []


def test_a_missing_destination_is_a_publish_error(destination: Destination, loop: asyncio.Runner) -> None:
    with pytest.raises(PublishError, match="no-such-queue"):
        loop.run(destination.sender.send("no-such-queue", [message()]))


def test_a_scheduled_message_arrives_when_it_is_due_and_not_before(destination: Destination,
                                                                   loop: asyncio.Runner) -> None:
    # A delayed retry's copy: held back in its queue until its time, then delivered like any other. Due 10 s on: the
    # send and the first read must end before then, and on a loaded 2-core machine (the test command) they once took
    # longer than the 2 s this allowed before.
    due = datetime.fromtimestamp(time.time(), UTC) + timedelta(seconds=10)
    now = message(application_properties={"retryAttempt": "1"})
    later = message(application_properties={"retryAttempt": "2"})
    later = OutgoingMessage(later.message_id, later.body, application_properties=later.application_properties,
                            scheduled_enqueue_time=due)
    loop.run(destination.sender.send(QUEUE, [later, now]))
    assert [m.message_id for m in destination.delivered()] == [now.message_id]
    destination.wait(11.0)
    arrived = destination.delivered()
    assert [m.message_id for m in arrived] == [now.message_id, later.message_id]
    assert arrived[1].application_properties == {"retryAttempt": "2"}


def test_a_scheduled_message_sent_again_inside_the_window_is_dropped(destination: Destination,
                                                                     loop: asyncio.Runner) -> None:
    # A copy sent again after a crash, under the same MessageId: the queue keeps one.
    due = datetime.fromtimestamp(time.time(), UTC) + timedelta(seconds=0.5)
    copy = OutgoingMessage(f"m-{uuid.uuid4()}", b"{}", scheduled_enqueue_time=due)
    loop.run(destination.sender.send(QUEUE, [copy]))
    loop.run(destination.sender.send(QUEUE, [copy]))
    destination.wait(1.5)
    assert [m.message_id for m in destination.delivered()] == [copy.message_id]
