"""Topics and subscriptions of the local broker, exercised with the unmodified azure-servicebus SDK."""

from __future__ import annotations

from azure.servicebus import ServiceBusMessage, ServiceBusReceiveMode, ServiceBusSubQueue

from tests.servicebus.conftest import Handlers, collect, opened


def test_topic_gives_each_matching_subscription_its_own_copy(sb: Handlers) -> None:
    handlers = (
        sb.topic_sender("fanout"),
        sb.subscription("fanout", "all"),
        sb.subscription("fanout", "eu"),
        sb.subscription("fanout", "invoices", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE),
    )
    with opened(*handlers) as (sender, everything, eu, invoices):
        sender.send_messages(
            [
                ServiceBusMessage(
                    "eu invoice", application_properties={"region": "eu"}, subject="invoice", correlation_id="c-1"
                ),
                ServiceBusMessage("us order", application_properties={"region": "us"}, subject="order"),
                ServiceBusMessage("invoice, other correlation", subject="invoice", correlation_id="c-2"),
                ServiceBusMessage(
                    "us invoice", application_properties={"region": "us"}, subject="invoice", correlation_id="c-1"
                ),
            ]
        )
        # No rules: everything. A correlation filter: only messages whose every filtered field matches.
        all_copies = collect(everything, 4)
        assert [str(m) for m in all_copies] == ["eu invoice", "us order", "invoice, other correlation", "us invoice"]
        [eu_copy] = collect(eu, 1)
        assert str(eu_copy) == "eu invoice"
        assert [str(m) for m in collect(invoices, 2)] == ["eu invoice", "us invoice"]
        # Copies share the topic's sequence number but are settled independently.
        assert eu_copy.sequence_number == all_copies[0].sequence_number
        eu.complete_message(eu_copy)
        everything.abandon_message(all_copies[0])
        assert everything.peek_messages(1, sequence_number=1)[0].delivery_count == 1
        assert eu.peek_messages(5, sequence_number=1) == []


def test_subscription_dead_letter_queue_is_addressed_under_the_subscription(sb: Handlers) -> None:
    handlers = (
        sb.topic_sender("topic-dlq"),
        sb.subscription("topic-dlq", "sub"),
        sb.subscription("topic-dlq", "sub", sub_queue=ServiceBusSubQueue.DEAD_LETTER),
    )
    with opened(*handlers) as (sender, receiver, dlq):
        sender.send_messages(ServiceBusMessage("unlucky"))
        [message] = collect(receiver, 1)
        receiver.abandon_message(message)  # MaxDeliveryCount 1
        [dead] = collect(dlq, 1)
        assert str(dead) == "unlucky"
        assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
        assert dead.dead_letter_source == "topic-dlq/Subscriptions/sub"
        dlq.complete_message(dead)
        assert dlq.peek_messages(5, sequence_number=1) == []
