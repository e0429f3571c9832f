"""A Functions app for the Settlement service's limits and the host's lock renewal
(tests/host/test_dead_letter_limits.py, tests/host/test_lock_renewal.py), apart from tests/host/rules_app so that
the rules' hosts don't open its receivers too.

Each function appends one JSON line per event to ``$RULES_JOURNAL`` (the function, MessageId and what happened),
as the rules app does; the tests read the journal.
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


def journal(function: str, msg: servicebus.ServiceBusReceivedMessage, event: str) -> None:
    """Append what happened to the journal file."""
    line = json.dumps({"function": function, "messageId": msg.message_id, "event": event})
    with _journal_lock, open(os.environ["RULES_JOURNAL"], "a", encoding="utf-8") as out:
        out.write(line + "\n")


@app.service_bus_queue_trigger(arg_name="msg", queue_name="dead-letters", connection="ServiceBusConnection",
                               auto_complete_messages=False)
def dead_letters(msg: servicebus.ServiceBusReceivedMessage,
                 message_actions: servicebus.ServiceBusMessageActions) -> None:
    """Dead-letters with a reason or description of the length the body asks for; when the host refuses that,
    completes the message, which only works if the refusal left it locked and unsettled."""
    asked = json.loads(str(msg))
    try:
        message_actions.deadletter(msg, deadletter_reason="r" * asked.get("reason", 1),
                                   deadletter_error_description="d" * asked.get("description", 1))
        journal("dead_letters", msg, "dead-lettered")
    except Exception as exc:  # the journal records what the host answered: the gRPC error under SettlementError
        rpc = exc.original  # type: ignore[attr-defined]
        journal("dead_letters", msg, f"refused {rpc.code().name}: {rpc.details()}")
        message_actions.complete(msg)
        journal("dead_letters", msg, "completed after the refusal")


@app.service_bus_queue_trigger(arg_name="msg", queue_name="renews", connection="ServiceBusConnection",
                               auto_complete_messages=False)
def renews(msg: servicebus.ServiceBusReceivedMessage, message_actions: servicebus.ServiceBusMessageActions) -> None:
    """Sleeps past its queue's 5 s lock (the body's ``sleep`` seconds), then completes; completes a redelivery at
    once."""
    sleep_then_complete("renews", msg, message_actions)


@app.service_bus_queue_trigger(arg_name="msg", queue_name="renews-sessions", connection="ServiceBusConnection",
                               is_sessions_enabled=True, auto_complete_messages=False)
def renews_sessions(msg: servicebus.ServiceBusReceivedMessage,
                    message_actions: servicebus.ServiceBusMessageActions) -> None:
    """As ``renews``, on a session queue with a 5 s lock: the session's lock is what has to last."""
    sleep_then_complete("renews_sessions", msg, message_actions)


def sleep_then_complete(function: str, msg: servicebus.ServiceBusReceivedMessage,
                        message_actions: servicebus.ServiceBusMessageActions) -> None:
    """The first delivery sleeps for the body's ``sleep`` seconds, then completes; a redelivery completes at once."""
    if seen_before(function, msg):
        message_actions.complete(msg)
        journal(function, msg, "redelivery completed")
        return
    journal(function, msg, "started")
    time.sleep(json.loads(str(msg))["sleep"])
    try:
        message_actions.complete(msg)
        journal(function, msg, "completed")
    except Exception as exc:  # the journal records what the host answered
        journal(function, msg, f"complete refused: {type(exc).__name__}")
