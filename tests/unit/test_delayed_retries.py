"""Delayed retries in the delivery policy: tried inside the lock, then handed on as a scheduled copy that is sent
before the delivery is completed; the copy read as its original; the total limit; the breaker."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from idempotent_consumer import identity, retries
from idempotent_consumer.breaker import Admission, Breaker
from idempotent_consumer.delivery import Action, Retries, Settlement, run_delivery
from idempotent_consumer.errors import DownstreamUnavailable, PublishError
from idempotent_consumer.messages import Headers, InboundMessage
from idempotent_consumer.outcomes import Outcome, Result
from idempotent_consumer.ports import watched as health
from idempotent_consumer.ports.sender import OutgoingMessage
from idempotent_consumer.retries import Backoff, Chain
from idempotent_consumer.testing.memory import InMemoryStore, RecordingSender
from shared import bootstrap
from shared.adapters.memory import InMemoryFulfilment
from shared.ports import watched as fulfilment_health
from shared.ports.fulfilment import Reply
from shared.settings import Settings
from tests.support.orders import inbound, order_body
from tests.support.records import claims, replaced

# Each test runs with the reservation claim written as a document of its own, and inside the order.
pytestmark = pytest.mark.usefixtures("claim_form")

NOW = 1_796_083_200.0
QUEUE = "orders"
BACKOFF = Backoff(base_seconds=10, ceiling_seconds=900, total_seconds=4 * 3600)


class Journal:
    """One ordered record of what the delivery did: handler calls, waits, sends and the settlement."""

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.settled: list[tuple[Settlement, Result]] = []
        self.seen_ids: list[str | None] = []

    def handler(self, *outcomes: Outcome) -> Any:
        answers = list(outcomes)

        async def handle(message: InboundMessage) -> Result:
            self.steps.append("try")
            self.seen_ids.append(message.message_id)
            outcome = answers.pop(0) if len(answers) > 1 else answers[0]
            health.note(fulfilment_health.FULFILMENT, up=outcome is not Outcome.TRANSIENT)  # as a watched port notes it
            return Result(outcome, "fulfilment.reserve: HTTP 503", "hash-1")
        return handle

    async def sleep(self, seconds: float) -> None:
        self.steps.append(f"wait {seconds:g}")


class Port:
    def __init__(self, journal: Journal, *, fail: bool = False) -> None:
        self.journal, self.fail = journal, fail

    async def settle(self, settlement: Settlement, result: Result) -> None:
        self.journal.steps.append(settlement.action.value)
        self.journal.settled.append((settlement, result))
        if self.fail:
            raise RuntimeError("the process died before the settlement reached the broker")

    async def renew_session_lock(self) -> datetime | None:
        return None


class JournalSender(RecordingSender):
    """A recording sender that writes its sends into the journal, and fails when told to."""

    def __init__(self, journal: Journal, *, fail: bool = False) -> None:
        super().__init__(clock=lambda: NOW)
        self.journal, self.fail = journal, fail

    async def send(self, destination: str, messages: Any) -> None:
        if self.fail:
            raise PublishError(f"send to {destination} failed: ServiceBusConnectionError")
        self.journal.steps.append(f"send {destination}")
        await super().send(destination, messages)


def _message(*, properties: dict[str, str] | None = None, locked_for: float = 300.0, **kw: Any) -> InboundMessage:
    return InboundMessage(
        message_id=kw.pop("message_id", "ord-1"), body=b'{"orderId":"ord-1"}', correlation_id="corr-1",
        sequence_number=kw.pop("sequence_number", 42), application_properties=properties or {"tenant": "eu"},
        locked_until_utc=datetime.fromtimestamp(NOW + locked_for, UTC),
        headers=Headers(subject="OrderPlaced", content_type="application/json", reply_to="replies",
                        time_to_live=timedelta(hours=6)), **kw)


def _deliver(journal: Journal, handler: Any, *, message: InboundMessage | None = None, attempts: int = 3,
             sender: RecordingSender | None = None, backoff: Backoff | None = BACKOFF, breaker: Breaker | None = None,
             port: Port | None = None, now: float = NOW) -> tuple[Settlement, RecordingSender]:
    sender = sender or JournalSender(journal)
    retrying = Retries(wait=10, attempts=attempts, backoff=backoff, queue=QUEUE, sender=lambda: sender,
                       breaker=breaker)
    settled = asyncio.run(run_delivery("process_order", lambda: message or _message(), handler, port or Port(journal),
                                       retrying=retrying, clock=lambda: now, sleep=journal.sleep,
                                       record=lambda *_: None))
    return settled, sender


def _copy(sender: RecordingSender) -> OutgoingMessage:
    [(destination, copy)] = sender.sent
    assert destination == QUEUE
    return copy


def test_a_transient_failure_is_tried_in_the_lock_then_handed_on_before_the_delivery_is_completed() -> None:
    journal = Journal()
    settled, sender = _deliver(journal, journal.handler(Outcome.TRANSIENT))
    assert settled == Settlement(Action.COMPLETE)
    assert journal.steps == ["try", "wait 10", "try", "wait 10", "try", f"send {QUEUE}", "complete"]
    [(_, result)] = journal.settled
    assert result.outcome is Outcome.HANDED_ON
    copy = _copy(sender)
    assert copy.message_id == identity.retry_message_id("ord-1", "42", 1)
    assert copy.scheduled_enqueue_time is not None
    due = (copy.scheduled_enqueue_time - datetime.fromtimestamp(NOW, UTC)).total_seconds()
    assert 8 <= due <= 12  # the first delay, 10 s, jittered by up to a fifth


def test_the_copy_is_the_message_with_its_headers_and_properties_and_the_retry_properties() -> None:
    journal = Journal()
    _, sender = _deliver(journal, journal.handler(Outcome.TRANSIENT), message=_message(session_id="ord-1"))
    copy = _copy(sender)
    assert (copy.body, copy.session_id, copy.correlation_id) == (b'{"orderId":"ord-1"}', "ord-1", "corr-1")
    assert (copy.subject, copy.content_type, copy.reply_to, copy.time_to_live) == (
        "OrderPlaced", "application/json", "replies", timedelta(hours=6))
    assert copy.application_properties == {
        "tenant": "eu", retries.ORIGINAL: "ord-1", retries.CHAIN: "42", retries.ATTEMPT: "1",
        retries.FIRST_FAILED_AT: datetime.fromtimestamp(NOW, UTC).isoformat(),
        retries.REASON: "fulfilment.reserve: HTTP 503"}


def test_a_success_inside_the_lock_completes_and_hands_nothing_on() -> None:
    journal = Journal()
    settled, sender = _deliver(journal, journal.handler(Outcome.TRANSIENT, Outcome.CREATED))
    assert settled == Settlement(Action.COMPLETE)
    assert journal.steps == ["try", "wait 10", "try", "complete"]
    assert sender.sent == []


def test_a_copy_is_read_as_its_original_and_hands_on_the_next_attempt_of_its_chain() -> None:
    journal = Journal()
    first = datetime.fromtimestamp(NOW - 600, UTC)
    copy = _message(message_id=identity.retry_message_id("ord-1", "42", 2), sequence_number=977, properties={
        "tenant": "eu", retries.ORIGINAL: "ord-1", retries.CHAIN: "42", retries.ATTEMPT: "2",
        retries.FIRST_FAILED_AT: first.isoformat(), retries.REASON: "earlier"})
    _, sender = _deliver(journal, journal.handler(Outcome.TRANSIENT), message=copy)
    assert set(journal.seen_ids) == {"ord-1"}  # the consumer's key is the original MessageId
    nxt = _copy(sender)
    assert nxt.message_id == identity.retry_message_id("ord-1", "42", 3)
    assert nxt.application_properties[retries.ATTEMPT] == "3"
    assert nxt.application_properties[retries.FIRST_FAILED_AT] == first.isoformat()
    assert nxt.application_properties["tenant"] == "eu"


def test_a_copy_sent_again_after_a_crash_has_the_same_message_id_so_the_queue_drops_it() -> None:
    journal = Journal()
    sender = JournalSender(journal)
    with pytest.raises(RuntimeError):
        _deliver(journal, journal.handler(Outcome.TRANSIENT), sender=sender, port=Port(journal, fail=True))
    _deliver(journal, journal.handler(Outcome.TRANSIENT), sender=sender)  # the redelivery of the same message
    assert [m.message_id for _, m in sender.sent] == [identity.retry_message_id("ord-1", "42", 1)] * 2
    assert len(sender.scheduled) + len(sender.delivered) == 1


def test_a_copy_that_cannot_be_sent_is_not_completed_but_abandoned_after_its_wait() -> None:
    journal = Journal()
    settled, _ = _deliver(journal, journal.handler(Outcome.TRANSIENT), sender=JournalSender(journal, fail=True))
    assert settled == Settlement(Action.ABANDON)
    assert journal.steps[-2:] == ["wait 10", "abandon"]
    [(_, result)] = journal.settled
    assert result.outcome is Outcome.TRANSIENT and "handing on failed: PublishError" in result.description


def test_past_the_total_limit_the_delivery_is_dead_lettered_saying_how_long_it_was_tried() -> None:
    journal = Journal()
    first = datetime.fromtimestamp(NOW - 4 * 3600 - 5, UTC)
    copy = _message(message_id="retry.x", properties={
        retries.ORIGINAL: "ord-1", retries.CHAIN: "42", retries.ATTEMPT: "21",
        retries.FIRST_FAILED_AT: first.isoformat()})
    settled, sender = _deliver(journal, journal.handler(Outcome.TRANSIENT), message=copy)
    assert settled == Settlement(Action.DEADLETTER, "RetryLimitExceeded")
    [(_, result)] = journal.settled
    assert result.description.startswith("tried for 4h00m05s since ")
    assert "over 21 delayed retries; last failure: fulfilment.reserve: HTTP 503" in result.description
    assert sender.sent == []


def test_the_last_copy_is_due_at_the_total_limit_not_after_it() -> None:
    first = datetime.fromtimestamp(NOW, UTC)
    chain = Chain("ord-1", "42", 20, first)
    now = first + timedelta(seconds=4 * 3600 - 30)
    assert BACKOFF.next_copy(chain, now) == first + timedelta(seconds=4 * 3600)


def test_the_backoff_doubles_up_to_its_ceiling_jittered_by_at_most_a_fifth_and_the_same_for_a_resend() -> None:
    for attempt, raw in [(1, 10), (2, 20), (3, 40), (6, 320), (7, 640)]:
        delay = BACKOFF.delay("42", attempt)
        assert 0.8 * raw <= delay <= 1.2 * raw
        assert delay == BACKOFF.delay("42", attempt)
    assert all(BACKOFF.delay("42", attempt) <= 900 for attempt in range(1, 60))
    assert len({round(BACKOFF.delay(str(chain), 3), 3) for chain in range(50)}) > 40  # chains spread apart


@pytest.mark.parametrize("properties", [
    {retries.ORIGINAL: "ord-1", retries.ATTEMPT: "1", retries.FIRST_FAILED_AT: "2026-12-01T00:00:00+00:00"},
    {retries.ORIGINAL: "ord-1", retries.CHAIN: "42", retries.ATTEMPT: "zero",
     retries.FIRST_FAILED_AT: "2026-12-01T00:00:00+00:00"},
    {retries.ORIGINAL: "ord-1", retries.CHAIN: "42", retries.ATTEMPT: "1", retries.FIRST_FAILED_AT: "yesterday"},
    {retries.ORIGINAL: "ord-1", retries.CHAIN: "42", retries.ATTEMPT: "1", retries.FIRST_FAILED_AT: "2026-12-01"},
])
def test_a_copy_whose_retry_properties_do_not_read_is_dead_lettered_invalid_untried(properties: dict[str, str]) -> None:
    journal = Journal()
    settled, sender = _deliver(journal, journal.handler(Outcome.CREATED), message=_message(properties=properties))
    assert settled == Settlement(Action.DEADLETTER, "InvalidMessage")
    assert journal.steps == ["deadletter"] and sender.sent == []


def test_without_delayed_retries_a_transient_failure_waits_once_and_abandons() -> None:
    journal = Journal()
    settled, sender = _deliver(journal, journal.handler(Outcome.TRANSIENT), backoff=None)
    assert settled == Settlement(Action.ABANDON)
    assert journal.steps == ["try", "wait 10", "abandon"]
    assert sender.sent == []


def test_a_lock_too_short_for_another_wait_hands_on_at_once() -> None:
    journal = Journal()
    _deliver(journal, journal.handler(Outcome.TRANSIENT), message=_message(locked_for=12.0))
    assert journal.steps == ["try", f"send {QUEUE}", "complete"]


def test_an_error_is_not_handed_on_it_abandons_toward_max_delivery_count() -> None:
    journal = Journal()
    settled, sender = _deliver(journal, journal.handler(Outcome.ERROR))
    assert settled == Settlement(Action.ABANDON) and sender.sent == []


def test_the_breaker_opens_when_most_attempts_fail_then_hands_on_untried_until_a_probe_succeeds() -> None:
    breaker = Breaker("process_order", window=4, open_seconds=30)
    journal = Journal()
    _deliver(journal, journal.handler(Outcome.TRANSIENT), attempts=1, breaker=breaker)
    assert not breaker.is_open  # one attempt of a window of four is not yet a verdict
    _deliver(journal, journal.handler(Outcome.TRANSIENT), attempts=1, breaker=breaker)
    assert breaker.is_open
    journal.steps.clear()
    settled, _ = _deliver(journal, journal.handler(Outcome.CREATED), breaker=breaker, now=NOW + 5)
    assert settled == Settlement(Action.COMPLETE)
    assert journal.steps == [f"send {QUEUE}", "complete"]  # handed on, not tried
    assert "breaker is open" in journal.settled[-1][1].description
    journal.steps.clear()
    _deliver(journal, journal.handler(Outcome.TRANSIENT), breaker=breaker, now=NOW + 31)  # the probe: one try
    assert journal.steps == ["try", f"send {QUEUE}", "complete"] and breaker.is_open
    assert breaker.admit(NOW + 40) is Admission.HAND_ON
    journal.steps.clear()
    _deliver(journal, journal.handler(Outcome.CREATED), breaker=breaker, now=NOW + 62)
    assert journal.steps == ["try", "complete"] and not breaker.is_open
    assert breaker.admit(NOW + 63) is Admission.TRY


def test_a_delivery_stops_retrying_in_its_lock_once_the_breaker_opens() -> None:
    breaker = Breaker("process_order", window=2, open_seconds=30)
    journal = Journal()
    _deliver(journal, journal.handler(Outcome.TRANSIENT), attempts=5, breaker=breaker)
    assert journal.steps == ["try", f"send {QUEUE}", "complete"]


def test_a_probe_that_never_reports_holds_up_the_next_one_for_open_seconds_only() -> None:
    breaker = Breaker("process_order", window=2, open_seconds=30)
    breaker.record(True, NOW)
    assert breaker.admit(NOW + 30) is Admission.PROBE  # its process dies: nothing is recorded
    assert breaker.admit(NOW + 45) is Admission.HAND_ON
    assert breaker.admit(NOW + 60) is Admission.PROBE


def test_a_breaker_with_open_seconds_zero_never_opens() -> None:
    breaker = Breaker("process_order", window=2, open_seconds=0)
    for _ in range(10):
        breaker.record(True, NOW)
    assert not breaker.is_open and breaker.admit(NOW) is Admission.TRY


def test_an_operators_resubmission_drops_the_retry_properties_and_keeps_the_others() -> None:
    properties = {"tenant": "eu", retries.ORIGINAL: "ord-1", retries.CHAIN: "42", retries.ATTEMPT: "3",
                  retries.FIRST_FAILED_AT: "2026-12-01T00:00:00+00:00", retries.REASON: "x"}
    assert retries.originals(properties) == {"tenant": "eu"}


def test_a_copy_is_read_as_a_delivery_of_its_chains_original_sequence_number() -> None:
    copy = _message(message_id="retry.x", sequence_number=977, properties={
        retries.ORIGINAL: "ord-1", retries.CHAIN: "42", retries.ATTEMPT: "1",
        retries.FIRST_FAILED_AT: "2026-12-01T00:00:00+00:00"})
    unwrapped, chain = retries.unwrap(copy)
    assert (unwrapped.message_id, unwrapped.sequence_number) == ("ord-1", 42)
    assert chain == Chain("ord-1", "42", 1, datetime(2026, 12, 1, tzinfo=UTC), "")


def test_a_copy_takes_over_the_claim_an_earlier_delivery_of_its_chain_left_live() -> None:
    # Found by the simulator (seed 118): the first delivery's release of its lease failed (another writer had
    # changed the record), so its claim stayed live; a copy read as another message would have found it
    # "in progress" and completed, leaving the reservation to no one.
    store, fulfilment = InMemoryStore(), InMemoryFulfilment()
    settings = Settings(fulfillment_url="http://fulfilment.invalid", abandon_delay_seconds=0)

    class DownOnce:
        def __init__(self) -> None:
            self.down = True

        async def reserve(self, key: str, request: Any) -> Any:
            if self.down:
                self.down = False
                raise DownstreamUnavailable("connect refused")
            return await fulfilment.reserve(key, request)

    app = bootstrap.build(settings, store=store, fulfilment=DownOnce(), sender=RecordingSender(), clock=lambda: NOW)
    body = order_body("ord-9")
    first = inbound(body, sequence_number=42, locked_until_utc=datetime.fromtimestamp(NOW + 60, UTC))
    assert asyncio.run(app.handle_order(first)).outcome is Outcome.TRANSIENT
    [record] = claims(store.documents())
    asyncio.run(replaced(store, {**record, "leaseUntil": NOW + 60}))  # the lease as left
    copy = inbound(body, message_id="retry.y", sequence_number=977, application_properties={
        retries.ORIGINAL: "ord-9", retries.CHAIN: "42", retries.ATTEMPT: "1",
        retries.FIRST_FAILED_AT: datetime.fromtimestamp(NOW, UTC).isoformat()},
        locked_until_utc=datetime.fromtimestamp(NOW + 60, UTC))
    unwrapped, _ = retries.unwrap(copy)
    result = asyncio.run(app.handle_order(unwrapped))
    assert (result.outcome, result.description[:34]) == (Outcome.DUPLICATE, "reserve-stock completed, attempt 2")
    assert fulfilment.reservation_count() == 1


@pytest.mark.parametrize(("failure", "up"), [
    (DownstreamUnavailable("fulfilment call failed: ClientConnectorError"), False),  # unreachable: maybe down
    (Reply(503, {}), False),
    (DownstreamUnavailable("fulfilment call failed: SocketTimeoutError", slow=True), True),  # took it, slow
    (Reply(409, {"reason": "key-in-flight"}), True),  # the key's first request still runs
])
def test_the_reservation_says_whether_a_transient_failure_shows_the_service_up(
    failure: DownstreamUnavailable | Reply, up: bool,
) -> None:
    class Failing:
        async def reserve(self, key: str, request: Any) -> Reply:
            if isinstance(failure, DownstreamUnavailable):
                raise failure
            return failure

    settings = Settings(fulfillment_url="http://fulfilment.invalid", abandon_delay_seconds=0)
    app = bootstrap.build(settings, store=InMemoryStore(), fulfilment=Failing(), sender=RecordingSender(),
                          clock=lambda: NOW)
    result = asyncio.run(app.handle_order(inbound(order_body("ord-3"), sequence_number=42)))
    assert (result.outcome, result.dependency_up) == (Outcome.TRANSIENT, up)
    assert result.description.startswith("order ord-3: ")


def test_a_service_that_answers_busy_or_slow_never_opens_the_breaker_and_every_message_is_tried() -> None:
    # A slow service (each first call times out while it works; the next meets it in flight, 409) is up: were
    # its answers counted as an outage, the breaker would hand the backlog on untried, probe by probe, until
    # the total limit dead-lettered messages the service would have taken (found by the chaos suite against
    # the IETF-draft stand-in).
    breaker = Breaker("process_order", window=4, open_seconds=30)
    journal = Journal()

    async def busy(message: InboundMessage) -> Result:
        journal.steps.append("try")
        health.note(fulfilment_health.FULFILMENT, up=True)  # it answered
        return Result(Outcome.TRANSIENT, "fulfilment.reserve: HTTP 409", "hash-1", dependency_up=True)

    for second in range(10):
        _deliver(journal, busy, breaker=breaker, now=NOW + second)
    assert not breaker.is_open and breaker.opened == 0
    assert journal.steps.count("try") == 30  # every delivery tried three times inside its lock, then handed on
    breaker.record(True, NOW)
    breaker.record(True, NOW)
    assert breaker.is_open
    journal.steps.clear()
    _deliver(journal, busy, breaker=breaker, now=NOW + 31)  # the probe meets a busy service: it is up
    assert journal.steps == ["try", f"send {QUEUE}", "complete"] and not breaker.is_open


def test_the_last_delivery_of_a_chain_tries_even_with_the_breaker_open() -> None:
    breaker = Breaker("process_order", window=2, open_seconds=30)
    breaker.record(True, NOW)
    assert breaker.is_open and breaker.admit(NOW + 1) is Admission.HAND_ON
    first = datetime.fromtimestamp(NOW - 4 * 3600, UTC)  # the total limit reached: no further copy
    copy = _message(message_id="retry.x", properties={
        retries.ORIGINAL: "ord-1", retries.CHAIN: "42", retries.ATTEMPT: "21",
        retries.FIRST_FAILED_AT: first.isoformat()})
    journal = Journal()
    settled, _ = _deliver(journal, journal.handler(Outcome.CREATED), message=copy, breaker=breaker, now=NOW + 1)
    assert settled == Settlement(Action.COMPLETE) and journal.steps == ["try", "complete"]
    journal = Journal()
    settled, _ = _deliver(journal, journal.handler(Outcome.TRANSIENT), message=copy, breaker=breaker, now=NOW + 2)
    assert settled == Settlement(Action.DEADLETTER, "RetryLimitExceeded")
    assert journal.steps == ["try", "wait 10", "try", "wait 10", "try", "deadletter"]  # tried in full, not "not tried"
    assert journal.settled[-1][1].description.endswith("last failure: fulfilment.reserve: HTTP 503")


@pytest.mark.parametrize("properties", [
    {"retryAttempt": "2"},
    {"retryAttempt": "2", "retryChain": "7", "retryReason": "the producer's own resend"},
    {retries.LEGACY.original: "ord-1", retries.LEGACY.chain: "42", retries.LEGACY.attempt: "1",
     retries.LEGACY.first_failed_at: "yesterday"},
])
def test_a_producers_properties_under_the_old_unnamespaced_names_are_its_own_not_a_copy(
    properties: dict[str, str]
) -> None:
    message = _message(properties=properties)
    assert retries.unwrap(message) == (message, None)
    assert retries.originals(properties) == properties


def test_a_copy_the_release_before_scheduled_is_read_under_the_old_names_and_its_next_copy_drops_them() -> None:
    old = {"tenant": "eu", retries.LEGACY.original: "ord-1", retries.LEGACY.chain: "42", retries.LEGACY.attempt: "2",
           retries.LEGACY.first_failed_at: "2026-12-01T00:00:00+00:00", retries.LEGACY.reason: "HTTP 503"}
    unwrapped, chain = retries.unwrap(_message(message_id="retry.x", sequence_number=977, properties=old))
    assert (unwrapped.message_id, unwrapped.sequence_number) == ("ord-1", 42)
    assert chain is not None and (chain.attempt, chain.names) == (2, retries.LEGACY)
    assert retries.originals(old) == {"tenant": "eu"}


def test_the_namespaced_names_win_over_the_old_ones_on_one_message() -> None:
    properties = {retries.ORIGINAL: "ord-1", retries.CHAIN: "42", retries.ATTEMPT: "1",
                  retries.FIRST_FAILED_AT: "2026-12-01T00:00:00+00:00", "retryAttempt": "9"}
    chain = retries.chain_of(properties)
    assert chain is not None and (chain.attempt, chain.names) == (1, retries.CURRENT)
    assert retries.originals(properties) == {"retryAttempt": "9"}


def test_only_a_probe_that_reached_each_dependency_found_down_closes_the_breaker() -> None:
    breaker = Breaker("process_order", window=2, open_seconds=30)
    breaker.record(True, NOW, reach=health.Reach(answered={health.STORE}, down={fulfilment_health.FULFILMENT}))
    assert breaker.is_open and breaker.admit(NOW + 30) is Admission.PROBE
    breaker.record(False, NOW + 30, probe=True, reach=health.Reach(answered={health.STORE}))  # a duplicate
    assert breaker.is_open
    assert breaker.admit(NOW + 31) is Admission.PROBE  # it proved nothing: the next delivery probes at once
    breaker.record(False, NOW + 31, probe=True)  # an invalid message: it reached nothing
    assert breaker.is_open and breaker.admit(NOW + 32) is Admission.PROBE
    breaker.record(False, NOW + 32, probe=True,
                   reach=health.Reach(answered={health.STORE, fulfilment_health.FULFILMENT}))
    assert not breaker.is_open


def test_the_watched_ports_note_what_answered_and_what_was_down() -> None:
    class Down:
        async def reserve(self, key: str, request: Any) -> Reply:
            raise DownstreamUnavailable("connection refused")

    async def run() -> health.Reach:
        store = health.watched_store(InMemoryStore())
        with health.attempt() as reach:
            with contextlib.suppress(Exception):
                await store.read("missing", "missing")
            with contextlib.suppress(DownstreamUnavailable):
                await fulfilment_health.watched_fulfilment(Down()).reserve("key", {})
        return reach

    reach = asyncio.run(run())
    assert (reach.answered, reach.down) == ({health.STORE}, {fulfilment_health.FULFILMENT})


def test_the_chains_last_delivery_that_takes_the_probes_turn_is_the_probe_and_closes_the_breaker() -> None:
    breaker = Breaker("process_order", window=2, open_seconds=30)
    breaker.record(True, NOW, reach=health.Reach(down={fulfilment_health.FULFILMENT}))
    assert breaker.is_open
    first = datetime.fromtimestamp(NOW - 4 * 3600 + 31, UTC)  # its last delivery, due as a probe is
    copy = _message(message_id="retry.x", properties={
        retries.ORIGINAL: "ord-1", retries.CHAIN: "42", retries.ATTEMPT: "21",
        retries.FIRST_FAILED_AT: first.isoformat()})
    journal = Journal()
    settled, _ = _deliver(journal, journal.handler(Outcome.CREATED), message=copy, breaker=breaker, now=NOW + 31)
    assert settled == Settlement(Action.COMPLETE)
    assert not breaker.is_open and breaker.admit(NOW + 32) is Admission.TRY  # not open for another probe interval
