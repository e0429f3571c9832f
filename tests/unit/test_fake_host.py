"""The fake host drives the real extension: real settlement client over gRPC, real converter for messages.

Its Settlement service and its message encoding are the local host's own (devservers.host.settlement's
SettlementService, devservers.host.servicebus's binding_data), so these tests check that code too; the
fake only records the calls and answers the faults it is given.
"""

from __future__ import annotations

import sys
import threading
import uuid
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from azure.servicebus import ServiceBusReceivedMessage
from azure.servicebus.amqp import AmqpMessageBodyType
from azurefunctions.extensions.bindings.servicebus import ServiceBusMessageActions
from azurefunctions.extensions.bindings.servicebus.serviceBusMessageActions import SettlementError

from tests.support.fake_host import (
    LOCK_LOST,
    FakeHost,
    Settlement,
    SettlementRecorder,
    fake_host_fixture,  # noqa: F401  (registers the fake_host fixture)
    make_model_binding_data,
    make_received_message,
    running_fake_host,
)

ENQUEUED = datetime(2026, 11, 30, 12, 0, 0, 123000, tzinfo=UTC)
LOCKED_UNTIL = ENQUEUED + timedelta(seconds=60)


def _message(lock_token: uuid.UUID | None = None, **kwargs: object) -> ServiceBusReceivedMessage:
    return make_received_message(b'{"orderId": "o-1"}', message_id="m-1", lock_token=lock_token, **kwargs)


# -- settlement through the real client ----------------------------------------------------------------


def test_message_actions_is_the_extension_singleton_pointed_at_the_fake_host(fake_host: FakeHost) -> None:
    actions = fake_host.message_actions()
    assert type(actions) is ServiceBusMessageActions
    assert actions is ServiceBusMessageActions.get_instance()
    assert actions._uri == fake_host.address
    assert "--functions-grpc-max-message-length" in sys.argv


def test_complete_is_recorded_with_the_lock_token(fake_host: FakeHost) -> None:
    token = uuid.uuid4()
    msg = _message(token)
    fake_host.message_actions().complete(msg)
    assert fake_host.recorder.all() == [Settlement("complete", lock_token=str(token))]
    assert fake_host.recorder.settlements_for(token) == fake_host.recorder.all()


@pytest.mark.parametrize("action", ["abandon", "defer", "renew_lock"])
def test_abandon_defer_and_renew_are_recorded(fake_host: FakeHost, action: str) -> None:
    token = uuid.uuid4()
    actions = fake_host.message_actions()
    {"abandon": actions.abandon, "defer": actions.defer, "renew_lock": actions.renew_message_lock}[action](
        _message(token)
    )
    assert fake_host.recorder.settlements_for(token) == [Settlement(action, lock_token=str(token))]


def test_deadletter_carries_reason_and_description(fake_host: FakeHost) -> None:
    token = uuid.uuid4()
    fake_host.message_actions().deadletter(
        _message(token), deadletter_reason="InvalidMessage", deadletter_error_description="amount < 0"
    )
    [recorded] = fake_host.recorder.all()
    assert recorded == Settlement(
        "deadletter", lock_token=str(token), reason="InvalidMessage", description="amount < 0"
    )


def test_a_deadletter_description_over_4096_characters_is_refused_as_the_host_refuses_it(fake_host: FakeHost) -> None:
    actions = fake_host.message_actions()
    actions.deadletter(_message(), deadletter_reason="InvalidMessage", deadletter_error_description="x" * 4096)
    with pytest.raises(Exception, match="cannot exceed 4096 characters"):
        actions.deadletter(_message(), deadletter_reason="InvalidMessage", deadletter_error_description="x" * 4097)
    assert len(fake_host.recorder.all()) == 1


def test_deadletter_without_reason_sends_none(fake_host: FakeHost) -> None:
    fake_host.message_actions().deadletter(_message(), deadletter_reason="", deadletter_error_description=None)
    [recorded] = fake_host.recorder.all()
    assert (recorded.reason, recorded.description) == (None, None)


def test_session_calls_are_recorded_and_state_is_kept(fake_host: FakeHost) -> None:
    actions = fake_host.message_actions()
    actions.set_session_state("s-1", b"cursor=7")
    locked_until = actions.renew_session_lock("s-1").ToDatetime(tzinfo=UTC)
    assert fake_host.recorder.session_state("s-1") == b"cursor=7"
    actions.release_session("s-1")
    assert [s.action for s in fake_host.recorder.all()] == [
        "set_session_state",
        "renew_session_lock",
        "release_session",
    ]
    assert all(s.session_id == "s-1" and s.lock_token is None for s in fake_host.recorder.all())
    assert fake_host.recorder.all()[0].session_state == b"cursor=7"
    assert locked_until > datetime.now(UTC)
    assert fake_host.recorder.session_state("s-1") is None


# -- fault injection -----------------------------------------------------------------------------------


def test_fail_next_makes_the_real_client_raise_settlement_error(fake_host: FakeHost) -> None:
    fake_host.recorder.fail_next("complete", code=grpc.StatusCode.FAILED_PRECONDITION, details="lock lost")
    msg = _message()
    actions = fake_host.message_actions()
    with pytest.raises(SettlementError) as raised:
        actions.complete(msg)
    assert raised.value.method == "complete"
    assert isinstance(raised.value.original, grpc.RpcError)
    assert raised.value.original.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert raised.value.original.details() == "lock lost"
    assert fake_host.recorder.all() == []
    assert len(fake_host.recorder.rejected()) == 1
    actions.complete(msg)  # the fault was for one call only
    assert [s.action for s in fake_host.recorder.all()] == ["complete"]


def test_fail_next_only_matches_its_action(fake_host: FakeHost) -> None:
    fake_host.recorder.fail_next("deadletter")
    fake_host.message_actions().abandon(_message())
    assert [s.action for s in fake_host.recorder.all()] == ["abandon"]


def test_lost_lock_for_one_token_fails_every_call_for_it(fake_host: FakeHost) -> None:
    lost, healthy = uuid.uuid4(), uuid.uuid4()
    fake_host.recorder.fail_lock_token(lost)
    actions = fake_host.message_actions()
    for call in (actions.renew_message_lock, actions.complete, actions.abandon):
        with pytest.raises(SettlementError) as raised:
            call(_message(lost))
        assert raised.value.original.details() == LOCK_LOST
    actions.complete(_message(healthy))
    assert fake_host.recorder.settlements_for(lost) == []
    assert len(fake_host.recorder.settlements_for(healthy)) == 1


def test_applied_fault_settles_but_the_reply_is_lost(fake_host: FakeHost) -> None:
    token = uuid.uuid4()
    fake_host.recorder.fail_next("complete", applied=True)
    with pytest.raises(SettlementError):
        fake_host.message_actions().complete(_message(token))
    assert fake_host.recorder.settlements_for(token) == [Settlement("complete", lock_token=str(token))]


def test_second_settlement_of_a_lock_token_fails_like_a_lost_lock(fake_host: FakeHost) -> None:
    msg = _message()
    actions = fake_host.message_actions()
    actions.deadletter(msg, deadletter_reason="r")
    with pytest.raises(SettlementError):
        actions.complete(msg)
    assert [s.action for s in fake_host.recorder.all()] == ["deadletter"]


def test_duplicate_settlement_allowed_when_switched_off() -> None:
    with running_fake_host(SettlementRecorder(reject_duplicate_settlement=False)) as host:
        msg = _message()
        host.message_actions().complete(msg)
        host.message_actions().complete(msg)
        assert [s.action for s in host.recorder.all()] == ["complete", "complete"]


def test_session_faults(fake_host: FakeHost) -> None:
    fake_host.recorder.fail_next("renew_session_lock")
    with pytest.raises(SettlementError):
        fake_host.message_actions().renew_session_lock("s-1")


def test_message_without_lock_token_is_not_a_settlement_error(fake_host: FakeHost) -> None:
    # Extension bug (1.0.0b2): the except block formats an unbound local, so UnboundLocalError escapes.
    class NoToken:
        lock_token = None

    with pytest.raises(UnboundLocalError):
        fake_host.message_actions().complete(NoToken())


# -- concurrency ---------------------------------------------------------------------------------------


def test_sixteen_threads_settling_at_once_are_all_recorded(fake_host: FakeHost) -> None:
    tokens = [uuid.uuid4() for _ in range(16)]
    messages = [_message(token) for token in tokens]
    barrier = threading.Barrier(len(messages))
    errors: list[BaseException] = []

    def settle(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            actions = fake_host.message_actions()  # first callers race to create the singleton
            if i % 3 == 0:
                actions.deadletter(messages[i], deadletter_reason=f"r{i}", deadletter_error_description=f"d{i}")
            elif i % 3 == 1:
                actions.abandon(messages[i])
            else:
                actions.complete(messages[i])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=settle, args=(i,)) for i in range(len(messages))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    recorded = fake_host.recorder.all()
    assert len(recorded) == 16
    assert {s.lock_token for s in recorded} == {str(t) for t in tokens}
    for i, token in enumerate(tokens):
        [s] = fake_host.recorder.settlements_for(token)
        assert s.action == ("deadletter", "abandon", "complete")[i % 3]
        if s.action == "deadletter":
            assert (s.reason, s.description) == (f"r{i}", f"d{i}")


# -- fixture hygiene -----------------------------------------------------------------------------------


def test_context_manager_restores_argv_and_resets_the_singleton() -> None:
    before = list(sys.argv)
    with running_fake_host() as host:
        first = host.message_actions()
    assert sys.argv == before
    assert ServiceBusMessageActions._instance is None
    with running_fake_host() as host:
        second = host.message_actions()
        assert second is not first
        assert second._uri == host.address
        second.complete(_message())
        assert len(host.recorder.all()) == 1


# -- messages through the converter --------------------------------------------------------------------


def test_factory_round_trips_through_the_converter() -> None:
    token = uuid.uuid4()
    msg = make_received_message(
        b'{"orderId": "o-1"}',
        message_id="m-1",
        correlation_id="c-1",
        session_id="s-1",
        delivery_count=3,
        enqueued_time=ENQUEUED,
        locked_until=LOCKED_UNTIL,
        sequence_number=42,
        application_properties={"tenant": "t-1", "attempt": 2, "ratio": 0.5, "flag": True},
        lock_token=token,
        subject="order.placed",
    )
    assert type(msg) is ServiceBusReceivedMessage
    assert msg.message_id == "m-1"
    assert msg.correlation_id == "c-1"
    assert msg.session_id == "s-1"
    assert msg.content_type == "application/json"
    assert msg.subject == "order.placed"
    assert msg.lock_token == token
    assert isinstance(msg.lock_token, uuid.UUID)
    assert msg.sequence_number == 42
    assert msg.enqueued_time_utc == ENQUEUED
    assert msg.locked_until_utc == LOCKED_UNTIL
    assert msg.body_type == AmqpMessageBodyType.DATA
    assert list(msg.body) == [b'{"orderId": "o-1"}']
    # Through the converter, application property keys and string values come back as bytes.
    assert msg.application_properties == {b"tenant": b"t-1", b"attempt": 2, b"ratio": 0.5, b"flag": True}
    # The pinned extension drops the AMQP header the host sends, so the delivery count is lost.
    assert msg.delivery_count is None
    assert msg.time_to_live is None


def test_marker_prefix_layout_keeps_the_header() -> None:
    msg = make_received_message(
        b"x", message_id="m-1", delivery_count=3, time_to_live=timedelta(days=14), layout="marker_prefix"
    )
    # The host's header is the .NET message's, whose count is the wire's plus one (the wire says 3 before).
    assert msg.delivery_count == 4
    assert msg.time_to_live == timedelta(days=14)
    assert msg.message_id == "m-1"


def test_host_layout_is_lock_token_then_the_whole_amqp_message() -> None:
    token = uuid.uuid4()
    content = make_model_binding_data(b"x", message_id="m-1", lock_token=token).content
    assert content[:16] == token.bytes_le
    assert content[16:19] == b"\x00\x53\x70"  # the AMQP header section comes first
    assert content.find(b"x-opt-lock-token") > 16


def test_missing_message_id_reads_as_none() -> None:
    msg = make_received_message(b"{}", message_id=None)
    assert msg.message_id is None
    assert msg.raw_amqp_message.properties is not None
    assert msg.raw_amqp_message.properties.message_id is None


def test_defaults_are_plausible() -> None:
    msg = make_received_message(b"{}", message_id="m-1")
    assert msg.correlation_id is None
    assert msg.session_id is None
    assert msg.application_properties is None
    again = make_received_message(b"{}", message_id="m-1")
    assert msg.sequence_number is not None and again.sequence_number is not None
    assert again.sequence_number > msg.sequence_number  # another message, as a producer's copy is
    assert msg.enqueued_time_utc is not None
    assert msg.locked_until_utc == msg.enqueued_time_utc + timedelta(minutes=1)


def test_value_body_through_the_converter() -> None:
    msg = make_received_message(None, message_id="m-1", body_value={"orderId": "o-1", "qty": 2})
    assert msg.body_type == AmqpMessageBodyType.VALUE
    assert msg.body == {b"orderId": b"o-1", b"qty": 2}
    text = make_received_message(None, message_id="m-2", body_value="hello")
    assert text.body == b"hello"


def test_empty_data_body() -> None:
    msg = make_received_message(b"", message_id="m-1")
    assert msg.body_type == AmqpMessageBodyType.DATA
    assert list(msg.body) == [b""]


def test_messages_settle_through_the_fake_host(fake_host: FakeHost) -> None:
    msg = make_received_message(b"{}", message_id="m-1", session_id="s-1")
    fake_host.message_actions().complete(msg)
    assert fake_host.recorder.settlements_for(str(msg.lock_token))[0].action == "complete"
