"""A Functions app that breaks the host's rules on purpose, so that tests can see what the host does.

Each function appends one JSON line per call to ``$RULES_JOURNAL``: the function, MessageId, delivery
count and what happened. The tests read the journal; the app never settles behind the test's back.
"""

import json
import os
import threading
import time
from pathlib import Path

import azure.functions as func
import azurefunctions.extensions.bindings.servicebus as servicebus

app = func.FunctionApp()
_journal_lock = threading.Lock()


def seen_before(function: str, msg: servicebus.ServiceBusReceivedMessage) -> bool:
    """Whether the journal already has a line for this function and message."""
    path = Path(os.environ["RULES_JOURNAL"])
    return path.exists() and f'"{function}", "messageId": "{msg.message_id}"' in path.read_text()


def starts(function: str, msg: servicebus.ServiceBusReceivedMessage) -> int:
    """How many deliveries of this message the journal has seen start in this function."""
    with _journal_lock:
        lines = Path(os.environ["RULES_JOURNAL"]).read_text().splitlines()
    return sum(1 for line in lines if json.loads(line) == {"function": function, "messageId": msg.message_id,
                                                          "event": "started"})


def journal(function: str, msg: servicebus.ServiceBusReceivedMessage, event: str) -> None:
    """Append what happened to the journal file."""
    line = json.dumps({"function": function, "messageId": msg.message_id, "event": event})
    with _journal_lock, open(os.environ["RULES_JOURNAL"], "a", encoding="utf-8") as out:
        out.write(line + "\n")


@app.service_bus_queue_trigger(arg_name="msg", queue_name="raises", connection="ServiceBusConnection",
                               auto_complete_messages=False)
def raises(msg: servicebus.ServiceBusReceivedMessage, message_actions: servicebus.ServiceBusMessageActions) -> None:
    """Fails without settling: the host abandons, and the message comes back."""
    journal("raises", msg, "called")
    raise RuntimeError("raised on purpose")


@app.service_bus_queue_trigger(arg_name="msg", queue_name="settles-late", connection="ServiceBusConnection",
                               auto_complete_messages=False)
def settles_late(msg: servicebus.ServiceBusReceivedMessage,
                 message_actions: servicebus.ServiceBusMessageActions) -> None:
    """Returns, then tries to complete from another thread once the invocation is over."""
    def complete_later() -> None:
        time.sleep(1)
        try:
            message_actions.complete(msg)
            journal("settles_late", msg, "late complete accepted")
        except Exception as exc:  # the journal records what the host answered
            journal("settles_late", msg, f"late complete refused: {exc}")

    threading.Thread(target=complete_later).start()
    journal("settles_late", msg, "returned")


@app.service_bus_queue_trigger(arg_name="msg", queue_name="unsettled", connection="ServiceBusConnection",
                               auto_complete_messages=False)
def unsettled(msg: servicebus.ServiceBusReceivedMessage, message_actions: servicebus.ServiceBusMessageActions) -> None:
    """Leaves the first delivery unsettled (its lock expires), completes the next."""
    if seen_before("unsettled", msg):
        message_actions.complete(msg)
        journal("unsettled", msg, "completed")
    else:
        journal("unsettled", msg, "left unsettled")


@app.service_bus_queue_trigger(arg_name="msg", queue_name="slow", connection="ServiceBusConnection",
                               auto_complete_messages=False)
def slow(msg: servicebus.ServiceBusReceivedMessage, message_actions: servicebus.ServiceBusMessageActions) -> None:
    """Takes two seconds, then completes: long enough to be in flight when the host is told to stop."""
    journal("slow", msg, "started")
    time.sleep(2)
    message_actions.complete(msg)
    journal("slow", msg, "completed")


@app.service_bus_queue_trigger(arg_name="msg", queue_name="hangs", connection="ServiceBusConnection",
                               auto_complete_messages=False)
def hangs(msg: servicebus.ServiceBusReceivedMessage, message_actions: servicebus.ServiceBusMessageActions) -> None:
    """Outlives functionTimeout (5 s in host.json) on its first delivery; completes the next."""
    if seen_before("hangs", msg):
        message_actions.complete(msg)
        journal("hangs", msg, "completed")
        return
    journal("hangs", msg, "hanging")
    time.sleep(60)


@app.service_bus_queue_trigger(arg_name="msg", queue_name="in-sessions", connection="ServiceBusConnection",
                               is_sessions_enabled=True, auto_complete_messages=False)
def in_sessions(msg: servicebus.ServiceBusReceivedMessage,
                message_actions: servicebus.ServiceBusMessageActions) -> None:
    """Completes each message of a session queue; the journal line names its session."""
    message_actions.complete(msg)
    journal("in_sessions", msg, f"completed in session {msg.session_id}")


@app.service_bus_queue_trigger(arg_name="msg", queue_name="slow-sessions", connection="ServiceBusConnection",
                               is_sessions_enabled=True, auto_complete_messages=False)
def slow_sessions(msg: servicebus.ServiceBusReceivedMessage,
                  message_actions: servicebus.ServiceBusMessageActions) -> None:
    """Holds its delivery until the next delivery of the same message has started (at most 30 s), and
    for a second from the third on: long enough for its session to be let go under it and for another
    slot to run the message in parallel, however loaded the machine is; then completes."""
    journal("slow_sessions", msg, "started")
    mine = starts("slow_sessions", msg)
    deadline = time.monotonic() + (30 if mine < 3 else 1)
    while time.monotonic() < deadline and (mine >= 3 or starts("slow_sessions", msg) == mine):
        time.sleep(0.05)
    try:
        message_actions.complete(msg)
        journal("slow_sessions", msg, "completed")
    except Exception as exc:  # the journal records what the host answered
        journal("slow_sessions", msg, f"complete refused: {type(exc).__name__}")
