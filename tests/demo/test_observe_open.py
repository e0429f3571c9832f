"""The drivers' sender opens its link again when a loaded local broker does not accept it in time, and a drain poll
it did not answer is polled again."""

from __future__ import annotations

from typing import Any

import pytest
from azure.servicebus.exceptions import ServiceBusConnectionError

from demo import observe


class Sender:
    def __init__(self, fails: list[int]) -> None:
        self.fails, self.closed = fails, False

    def __enter__(self) -> Sender:
        if self.fails[0] > 0:
            self.fails[0] -= 1
            raise ServiceBusConnectionError(message="timed out")
        return self

    def close(self) -> None:
        self.closed = True


class Client:
    def __init__(self, fails: int) -> None:
        self.fails: list[int] = [fails]
        self.senders: list[Sender] = []

    def get_queue_sender(self, queue: str) -> Sender:
        self.senders.append(Sender(self.fails))
        return self.senders[-1]


def test_a_link_not_accepted_in_time_is_opened_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("demo.observe.time.sleep", lambda seconds: None)
    client: Any = Client(fails=observe.OPEN_ATTEMPTS - 1)
    sender = observe._opened(client, "orders")
    assert sender is client.senders[-1] and [s.closed for s in client.senders] == [True] * 3 + [False]


def test_a_broker_that_never_accepts_ends_the_run_with_its_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("demo.observe.time.sleep", lambda seconds: None)
    client: Any = Client(fails=observe.OPEN_ATTEMPTS)
    with pytest.raises(ServiceBusConnectionError):
        observe._opened(client, "orders")
    assert len(client.senders) == observe.OPEN_ATTEMPTS


def test_a_drain_poll_the_broker_did_not_answer_is_polled_again(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    answers: list[Any] = [ServiceBusConnectionError(message="timed out"), False, True]

    def drained(*args: Any) -> bool:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return bool(answer)

    monkeypatch.setattr("demo.observe.drained", drained)
    monkeypatch.setattr("demo.observe.time.sleep", lambda seconds: None)
    stack: Any = object()
    assert observe.wait_drained(stack, None, None, deadline=0.0, label="chaos")  # type: ignore[arg-type]
    assert answers == []
    assert "chaos: the broker did not answer a drain poll (ServiceBusConnectionError); polling again" \
        in capsys.readouterr().err


def test_any_other_failure_of_a_drain_poll_ends_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    def drained(*args: Any) -> bool:
        raise ValueError("a bug in the poll")

    monkeypatch.setattr("demo.observe.drained", drained)
    stack: Any = object()
    with pytest.raises(ValueError, match="a bug in the poll"):
        observe.wait_drained(stack, None, None, deadline=0.0, label="chaos")  # type: ignore[arg-type]
