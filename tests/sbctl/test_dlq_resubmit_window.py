"""dlq resubmit never loses a message to duplicate detection: against the local broker, with the SDK and sbctl only.

Service Bus accepts and then drops a message whose MessageId it saw within the queue's
duplicate-detection window. A dead letter resubmitted inside that window, counted from its original
send, would be dropped, so sbctl leaves it in the dead-letter queue and says until when. The local
broker has no administration endpoint, so the tests give the window with --detection-window.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from devservers.servicebus import Broker, start_broker
from sbctl.cli import main
from tests.sbctl.queues import config, dead_letter, queue, where

WINDOW_SECONDS = 8  # long enough for the test to act inside it, short enough to wait out
WINDOW = f"PT{WINDOW_SECONDS}S"

CONFIG = config(
    queue("window", RequiresDuplicateDetection=True, DuplicateDetectionHistoryTimeWindow=WINDOW),
    queue("wait", RequiresDuplicateDetection=True, DuplicateDetectionHistoryTimeWindow="PT2S"),
    queue("mixed", RequiresDuplicateDetection=True, DuplicateDetectionHistoryTimeWindow="PT2S"),
    queue("ids"), queue("nothing"),
)


@pytest.fixture(scope="module")
def conn() -> Iterator[str]:
    broker: Broker
    with start_broker(CONFIG) as broker:
        yield broker.connection_string


def resubmit(conn: str, queue_name: str, *options: str) -> list[str]:
    return ["dlq", "resubmit", "--queue", queue_name, *options, "--connection-string", conn]


def held_until(out: str, message_id: str) -> datetime:
    match = re.search(rf"^held {message_id} until (\S+)$", out, re.MULTILINE)
    assert match, out
    return datetime.fromisoformat(match.group(1).replace("Z", "+00:00"))


def test_inside_the_window_the_dead_letter_stays_and_after_it_goes_back_to_the_queue(
    conn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before_send = time.monotonic()
    dead_letter(conn, "window", [("w-1", "DownstreamRejected")])

    assert main(resubmit(conn, "window", "--detection-window", WINDOW)) == 4  # held back
    assert time.monotonic() - before_send < WINDOW_SECONDS, "too slow to test inside the window"
    out, err = capsys.readouterr()
    until = held_until(out, "w-1")
    assert "held back 1 message(s) in the dead-letter queue until" in err and "--wait" in err
    assert where(conn, "window", "w-1") == ["dead-letter queue"]  # in exactly one of the two, never neither

    time.sleep(max(0.0, (until - datetime.now(UTC)).total_seconds()))
    assert main(resubmit(conn, "window", "--detection-window", WINDOW)) == 0
    assert "resubmitted w-1" in capsys.readouterr().out
    assert where(conn, "window", "w-1") == ["queue"]


def test_wait_waits_the_window_out_then_resubmits(conn: str, capsys: pytest.CaptureFixture[str]) -> None:
    dead_letter(conn, "wait", [("w-2", "DownstreamRejected")])

    assert main(resubmit(conn, "wait", "--detection-window", "PT2S", "--wait")) == 0
    out, err = capsys.readouterr()
    assert out.index("held w-2 until") < out.index("resubmitted w-2")
    assert "waiting" in err and "resubmitted 1 message(s)" in err
    assert where(conn, "wait", "w-2") == ["queue"]


def test_only_the_dead_letters_inside_the_window_are_held(conn: str, capsys: pytest.CaptureFixture[str]) -> None:
    dead_letter(conn, "mixed", [("old", "X")])
    time.sleep(2 + 5 + 0.5)  # the window, its clock margin, and a little
    dead_letter(conn, "mixed", [("new", "X")])

    assert main(resubmit(conn, "mixed", "--detection-window", "PT2S")) == 4
    out = capsys.readouterr().out
    assert "resubmitted old" in out and "held new until" in out
    assert (where(conn, "mixed", "old"), where(conn, "mixed", "new")) == (["queue"], ["dead-letter queue"])


def test_ids_that_are_not_in_the_dead_letter_queue_are_reported(conn: str, capsys: pytest.CaptureFixture[str]) -> None:
    dead_letter(conn, "ids", [("i-1", "X")])
    options = ("--detection-window", "0")  # this queue has no duplicate detection

    assert main(resubmit(conn, "ids", "--ids", "i-1", "i-404", *options)) == 0
    assert "not found in the dead-letter queue of ids: i-404" in capsys.readouterr().err
    assert main(resubmit(conn, "ids", "--ids", "i-404", *options)) == 3
    assert "not found in the dead-letter queue of ids: i-404" in capsys.readouterr().err


@pytest.mark.parametrize("command", [
    ["dlq", "list"], ["dlq", "resubmit", "--detection-window", "0"], ["dlq", "resubmit", "--dry-run"],
    ["dlq", "purge", "--yes"], ["dlq", "purge"],
])
def test_nothing_matched_is_exit_status_3(conn: str, command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*command, "--queue", "nothing", "--connection-string", conn]) == 3
    assert "nothing" in capsys.readouterr().err
