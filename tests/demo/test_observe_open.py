"""The drivers' sender opens its link again when a loaded local broker does not accept it in time."""

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
