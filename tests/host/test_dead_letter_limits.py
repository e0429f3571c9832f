"""The host's Settlement service refuses a dead-letter reason or description over 4,096 characters, as the
Functions host does: Azure.Messaging.ServiceBus throws ArgumentOutOfRangeException before any network call, and
the extension's SettlementService answers the call with StatusCode.Unknown. The message stays locked and
unsettled."""

from __future__ import annotations

import json
import types
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from devservers.host.settlement import MAX_DEAD_LETTER_REASON_LENGTH, Deliveries, Delivery, LiveDeliveries, Refused
from devservers.servicebus import Broker
from tests.host.conftest import NEEDS_313, SETTLEMENT_APP, HostProcess, eventually, peek, send


class Receiver:
    """Records the dead-letter calls that reach the SDK; the host's refusals never get here."""

    session = None

    def __init__(self) -> None:
        self.dead_letters: list[tuple[str | None, str | None]] = []

    def dead_letter_message(self, message: Any, reason: str | None = None,
                            error_description: str | None = None) -> None:
        self.dead_letters.append((reason, error_description))


def live(receiver: Receiver) -> tuple[LiveDeliveries, Delivery, str]:
    deliveries = Deliveries()
    message: Any = types.SimpleNamespace(message_id="m-1", lock_token=str(uuid.uuid4()))
    delivery = Delivery(receiver, message)  # type: ignore[arg-type]
    return LiveDeliveries(deliveries), delivery, deliveries.register(delivery)


@pytest.mark.parametrize("argument", ["deadLetterReason", "deadLetterErrorDescription"])
def test_4096_characters_reach_the_broker_and_4097_are_refused_before_it(argument: str) -> None:
    def texts(length: int) -> tuple[str, str]:
        return ("x" * length, "d") if argument == "deadLetterReason" else ("r", "x" * length)

    receiver = Receiver()
    backend, delivery, token = live(receiver)
    with pytest.raises(Refused) as refused:
        backend.deadletter(token, *texts(MAX_DEAD_LETTER_REASON_LENGTH + 1), b"")
    assert refused.value.code is grpc.StatusCode.UNKNOWN
    assert refused.value.details == (f"System.ArgumentOutOfRangeException: The argument '{argument}' cannot exceed "
                                     f"4096 characters. (Parameter '{argument}')")
    assert receiver.dead_letters == [] and delivery.settled is None  # still locked, still settleable
    backend.deadletter(token, *texts(MAX_DEAD_LETTER_REASON_LENGTH), b"")
    assert receiver.dead_letters == [texts(4096)] and delivery.settled == "dead_letter"


def test_the_length_is_counted_in_utf16_code_units_as_dotnet_counts_it() -> None:
    receiver = Receiver()
    backend, _, token = live(receiver)
    with pytest.raises(Refused, match="'deadLetterReason' cannot exceed 4096"):
        backend.deadletter(token, "\N{GRINNING FACE}" * 2049, None, b"")  # 2,049 characters, 4,098 code units
    backend.deadletter(token, "\N{GRINNING FACE}" * 2048, None, b"")
    assert len(receiver.dead_letters) == 1


def test_an_unknown_lock_token_is_not_found_before_any_length_is_checked() -> None:
    backend, _, _ = live(Receiver())
    with pytest.raises(Refused) as refused:
        backend.deadletter("no-such-token", "x" * 5000, None, b"")
    assert refused.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details == "LockToken no-such-token not found."


@NEEDS_313
def test_the_workers_deadletter_call_fails_over_4096_characters_and_the_message_stays_settleable(
    broker: Broker, tmp_path: Path, start_host: Callable[..., HostProcess]
) -> None:
    journal = tmp_path / "journal.jsonl"
    start_host(SETTLEMENT_APP, {"FUNCTIONS_WORKER_RUNTIME": "python", "ServiceBusConnection": broker.connection_string,
                           "RULES_JOURNAL": str(journal)})
    asked = {f"m-{field}-{length}-{uuid.uuid4()}": {field: length}
             for field in ("reason", "description") for length in (4096, 4097)}
    for message_id, body in asked.items():
        send(broker, "dead-letters", json.dumps(body), message_id=message_id)

    def events() -> dict[str, list[str]]:
        lines = [json.loads(line) for line in journal.read_text().splitlines()] if journal.exists() else []
        found: dict[str, list[str]] = {}
        for line in lines:
            found.setdefault(line["messageId"], []).append(line["event"])
        return found

    def finished() -> dict[str, list[str]] | None:
        found = events()
        last = {found.get(m, [""])[-1] for m in asked}
        return found if last <= {"dead-lettered", "completed after the refusal"} else None

    done = eventually(finished, what="every message dead-lettered, or refused and completed")
    dead = {m.message_id: m for m in peek(broker, "dead-letters", dead_letters=True) if m.message_id in asked}
    for message_id, body in asked.items():
        [(field, length)] = body.items()
        argument = "deadLetterReason" if field == "reason" else "deadLetterErrorDescription"
        if length == 4096:
            assert done[message_id] == ["dead-lettered"]
            text = dead[message_id].dead_letter_reason if field == "reason" else \
                dead[message_id].dead_letter_error_description
            assert text == field[0] * 4096
        else:
            assert done[message_id] == [
                f"refused UNKNOWN: System.ArgumentOutOfRangeException: The argument '{argument}' cannot exceed 4096"
                f" characters. (Parameter '{argument}')", "completed after the refusal"]
            assert message_id not in dead
    assert not [m for m in peek(broker, "dead-letters") if m.message_id in asked]
