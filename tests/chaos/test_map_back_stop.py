"""The operator's last map-back pass, at the end of a chaos run, is made again when the local broker does not answer
in time, and its error ends the run once it has failed FINAL_ATTEMPTS times."""

from __future__ import annotations

from typing import Any

import pytest
from azure.servicebus.exceptions import ServiceBusConnectionError

from chaos import rollback
from chaos.rollback import MapBack

CONNECTION = "Endpoint=sb://127.0.0.1:1/;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0;UseDevelopmentEmulator=true"


def _map_back(monkeypatch: pytest.MonkeyPatch, answers: list[Any]) -> MapBack:
    map_back = MapBack(CONNECTION, ("orders",), 10.0)

    def once() -> int:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return int(answer)

    monkeypatch.setattr(map_back, "once", once)
    monkeypatch.setattr("chaos.rollback.time.sleep", lambda seconds: None)
    return map_back


def test_a_last_pass_the_broker_did_not_answer_is_made_again(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    answers: list[Any] = [ServiceBusConnectionError(message="timed out")] * (rollback.FINAL_ATTEMPTS - 1) + [3]
    assert _map_back(monkeypatch, answers).stop() == 3
    assert answers == []
    assert capsys.readouterr().out.count("the last map-back pass failed (ServiceBusConnectionError)") == \
        rollback.FINAL_ATTEMPTS - 1


def test_a_broker_that_never_answers_ends_the_run_with_its_error(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[Any] = [ServiceBusConnectionError(message="timed out")] * rollback.FINAL_ATTEMPTS
    with pytest.raises(ServiceBusConnectionError):
        _map_back(monkeypatch, answers).stop()
    assert answers == []


def test_any_other_failure_of_the_last_pass_is_not_made_again(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[Any] = [ValueError("a bug in the pass"), 1]
    with pytest.raises(ValueError, match="a bug in the pass"):
        _map_back(monkeypatch, answers).stop()
    assert answers == [1]
