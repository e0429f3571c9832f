"""sbctl's command line: every command and option, with help, an example and the exit statuses.

Numbers are checked where they are parsed, so a bad one is a usage error (exit status 2).
"""

from __future__ import annotations

import argparse
import enum
import math
import textwrap
from datetime import timedelta
from pathlib import Path

from sbctl import parked, schemas
from sbctl.connection import CONNECTION_ENV
from sbctl.detection import parse_window

PROG = "python -m sbctl"


class Exit(enum.IntEnum):
    """sbctl's exit statuses, the same for every command."""

    DONE = 0
    FAILED = 1
    USAGE = 2
    NOTHING_MATCHED = 3
    HELD_BACK = 4
    INTERRUPTED = 130


EXIT_STATUSES = """exit status (the same for every command):
  0    done
  1    failed; one line on stderr says why
  2    bad usage
  3    nothing matched: an empty list, nothing to resubmit or purge
  4    held back: dlq resubmit left dead letters that the queue would drop as duplicates
  130  interrupted"""
WIDTH = 100


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a rate: give a number from 0 to 1")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a count: give 1 or more")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text}: give a number of seconds, 0 or more")
    return value


def _window(text: str) -> timedelta:
    try:
        return parse_window(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _command(commands: argparse._SubParsersAction[argparse.ArgumentParser], name: str, summary: str,
             description: str, examples: list[str], *, exits: str = EXIT_STATUSES,
             parents: list[argparse.ArgumentParser] | None = None) -> argparse.ArgumentParser:
    if not exits.startswith("exit status ("):
        exits = textwrap.fill(exits, WIDTH, subsequent_indent="  ")
    epilog = "examples:\n" + "\n".join(f"  {PROG} {e}" for e in examples) + f"\n\n{exits}"
    return commands.add_parser(name, help=summary, description=textwrap.fill(description, WIDTH), epilog=epilog,
                               parents=parents or [], formatter_class=argparse.RawDescriptionHelpFormatter)


def _connection_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection")
    group.add_argument("--connection-string", metavar="TEXT",
                       help=f"Service Bus connection string (default: ${CONNECTION_ENV}); the local broker and the "
                            "emulator need UseDevelopmentEmulator=true in it")
    group.add_argument("--namespace", metavar="HOST",
                       help="fully qualified namespace, e.g. sb-x.servicebus.windows.net; authenticates with "
                            "DefaultAzureCredential (Entra ID)")
    return common


def _queue_option(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--queue", required=True, type=_name, metavar="NAME", help=text)


def _window_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--detection-window", type=_window, metavar="DURATION",
                        help="the queue's duplicate-detection window, when it cannot be read from the queue (the "
                             "local broker has no administration endpoint): ISO 8601 (PT10M) or seconds; 0 = the "
                             "queue has none (default: read from the queue, else PT10M, Bicep's default)")


def _selection_options(parser: argparse.ArgumentParser) -> None:
    _queue_option(parser, "the queue whose dead-letter queue to act on")
    parser.add_argument("--reason", metavar="REASON", help="only dead letters with this DeadLetterReason")
    parser.add_argument("--ids", nargs="+", default=[], type=_name, metavar="MESSAGE_ID",
                        help="only these MessageIds; those not found are reported")
    _copies_option(parser)


def _copies_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--copies", action="store_true",
                        help="only the copies a delayed retry handed on (under their original MessageId): those a "
                             "release that knows no copy dead-lettered InvalidMessage, after a rollback")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; every command has --help with examples and the exit statuses."""
    common = _connection_options()
    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill("Operator tools for the idempotent consumer's queues: send test traffic, inspect "
                                  "and repair dead-letter queues, resolve parked events, write the message "
                                  "schemas.", WIDTH),
        epilog="examples:\n"
               f"  {PROG} send --queue orders --generate 20 --seed 1\n"
               f"  {PROG} dlq list --queue orders\n"
               f"  {PROG} dlq resubmit --queue orders --reason DownstreamRejected --wait\n"
               f"  {PROG} parked list --cosmos-endpoint http://127.0.0.1:8081 --cosmos-key KEY\n\n"
               f"{EXIT_STATUSES}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _send_command(commands, common)
    _dlq_commands(commands, common)
    _retries_commands(commands, common)
    _parked_commands(commands)
    _index_commands(commands)
    schemas_cmd = _command(
        commands, "schemas", "write the messages' JSON Schemas",
        "Write the JSON Schema of each message, generated from the consumer's models, for producers to validate "
        "against.", ["schemas", "schemas --out /tmp/schemas"], exits="exit status: 0 written; 1 failed; 2 bad usage")
    schemas_cmd.add_argument("--out", type=Path, default=schemas.DEFAULT_DIR, metavar="DIR",
                             help="directory to write into (default: the repository's schemas/)")
    return parser


def _send_command(commands: argparse._SubParsersAction[argparse.ArgumentParser],
                  common: argparse.ArgumentParser) -> None:
    send = _command(
        commands, "send", "send orders or events",
        "Send orders or events: MessageId = the business id (orderId, or the event's id), SessionId = orderId for "
        "events, CorrelationId carried through. A file is checked whole before anything is sent.",
        ["send --queue orders --generate 1000 --duplicates 0.05 --reuse-ids 0.01 --seed 7",
         "send --queue order-events --generate 1000 --kind events --seed 7   # the lifecycles of those 1000 orders",
         "send --queue orders --generate 100 --late-duplicates 0.1 --seed 7   # copies after the detection window",
         "send --queue orders --file orders.jsonl"],
        exits="exit status: 0 sent; 1 failed (one line on stderr says why); 2 bad usage", parents=[common])
    _queue_option(send, "the queue to send to")
    source = send.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", type=Path, metavar="PATH",
                        help='JSON Lines (UTF-8): one order or event body per line, or {"body": ..., '
                             '"correlationId": ..., "applicationProperties": ...}')
    source.add_argument("--generate", type=_count, metavar="N",
                        help="generate N realistic orders; with --kind events, the lifecycle events of the same N "
                             "orders that --kind orders makes with the same --seed")
    send.add_argument("--kind", choices=["orders", "events"], default="orders",
                      help="what --generate makes (default: orders)")
    send.add_argument("--seed", type=int, default=None, metavar="N",
                      help="random seed, for reproducible traffic (default: a different run each time)")
    faults = send.add_argument_group("faults")
    faults.add_argument("--duplicates", type=_rate, default=0.0, metavar="RATE",
                        help="send an exact copy of this share of messages right after them, as a retrying producer "
                             "does (a queue with duplicate detection drops these: a warning says so)")
    faults.add_argument("--late-duplicates", type=_rate, default=0.0, metavar="RATE",
                        help="send an exact copy of this share of messages --after seconds after the rest, past the "
                             "queue's duplicate-detection window, so that the copies reach the consumer")
    faults.add_argument("--after", type=_seconds, metavar="SECONDS",
                        help="how long after the other messages the --late-duplicates copies go (default: the "
                             "queue's duplicate-detection window plus 5 s)")
    faults.add_argument("--reuse-ids", type=_rate, default=0.0, metavar="RATE",
                        help="send other content under this share of ids (to exercise PayloadMismatch)")
    faults.add_argument("--reuse-ids-elsewhere", type=_rate, default=0.0, metavar="RATE",
                        help="events only: send this share of event ids and sources again for another order (its "
                             "subject and session), their content changed (PayloadMismatch across orders)")
    _window_option(send)


def _dlq_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser],
                  common: argparse.ArgumentParser) -> None:
    dlq = _command(commands, "dlq", "inspect and repair a dead-letter queue",
                   "List, resubmit or purge the dead-lettered messages of a queue.",
                   ["dlq list --queue orders", "dlq resubmit --queue orders --ids ord-17 ord-42",
                    "dlq purge --queue orders --reason InvalidMessage"])
    dlq_commands = dlq.add_subparsers(dest="dlq_command", required=True, metavar="COMMAND")
    listing = _command(
        dlq_commands, "list", "list dead-lettered messages (peek)",
        "List the dead letters of a queue without locking or changing them: messageId, reason, description, "
        "deliveryCount, enqueuedTime.",
        ["dlq list --queue orders", "dlq list --queue orders --json --max 50"],
        exits="exit status: 0 listed; 1 failed; 2 bad usage; 3 the dead-letter queue is empty", parents=[common])
    _queue_option(listing, "the queue whose dead-letter queue to list")
    listing.add_argument("--json", action="store_true", help="print a JSON array instead of a table")
    listing.add_argument("--max", type=_count, default=None, metavar="N", help="at most N dead letters")
    _copies_option(listing)
    resubmit = _command(
        dlq_commands, "resubmit", "send dead-lettered messages back to their queue",
        "Send each selected dead letter back to its queue with the same MessageId, body and properties (minus the "
        "dead-letter ones), and remove it from the dead-letter queue only once it was sent. A dead letter still "
        "inside the queue's duplicate-detection window, counted from its original send, stays in the dead-letter "
        "queue: the queue would drop its resubmission. The tool says how many it held back and until when; --wait "
        "waits and resubmits them.",
        ["dlq resubmit --queue order-events --reason InvalidTransition --dry-run",
         "dlq resubmit --queue orders --reason InvalidMessage --copies --wait   # after a rollback",
         "dlq resubmit --queue orders --ids ord-17 ord-42",
         "dlq resubmit --queue orders --reason DownstreamRejected --wait"],
        exits="exit status: 0 all selected resubmitted; 1 failed; 2 bad usage; 3 nothing matched; "
              "4 some held back (run again after the time given, or use --wait)", parents=[common])
    _selection_options(resubmit)
    resubmit.add_argument("--dry-run", action="store_true",
                          help="list what would be resubmitted and what held back; change nothing")
    resubmit.add_argument("--wait", action="store_true",
                          help="wait out the duplicate-detection window of the held-back messages, then resubmit them")
    _window_option(resubmit)
    purge = _command(
        dlq_commands, "purge", "delete dead-lettered messages",
        "Delete the selected dead letters, after asking (--yes to skip the question).",
        ["dlq purge --queue orders --reason InvalidMessage", "dlq purge --queue orders --ids ord-17 --yes"],
        exits="exit status: 0 deleted; 1 failed or not confirmed; 2 bad usage; 3 nothing matched",
        parents=[common])
    _selection_options(purge)
    purge.add_argument("--yes", action="store_true", help="don't ask for confirmation")


def _retries_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser],
                      common: argparse.ArgumentParser) -> None:
    retries = _command(commands, "retries", "see and hurry the messages waiting for a delayed retry",
                       "The consumer hands a message that keeps failing transiently on to a later time: a copy "
                       "scheduled on its own queue, with its original MessageId, attempt, first failure and reason "
                       "(docs/operations.md, In an outage). A session-enabled queue can be read only one session "
                       "at a time: give --session (the orderId) for the events queue.",
                       ["retries list --queue orders", "retries send-now --queue orders --ids ord-17",
                        "retries list --queue order-events --session ord-17"])
    retries_commands = retries.add_subparsers(dest="retries_command", required=True, metavar="COMMAND")
    listing = _command(
        retries_commands, "list", "list the copies waiting for their retry, with when and why (peek)",
        "Peeks the queue and lists every scheduled copy the consumer handed on: its original MessageId, attempt, "
        "when it is due, when the message first failed, and why the last delivery handed it on.",
        ["retries list --queue orders", "retries list --queue orders --json"], parents=[common])
    sending = _command(
        retries_commands, "send-now", "send waiting copies now, instead of at their time",
        "Sends each chosen copy again, due at once, under a MessageId of its own, and only then cancels the "
        "scheduled copy: a failure between the two leaves the message twice, which the consumer absorbs, never "
        "not at all. Use it once the dependency is back, a few at a time first.",
        ["retries send-now --queue orders --ids ord-17 ord-42", "retries send-now --queue orders --all"],
        parents=[common])
    for command in (listing, sending):
        _queue_option(command, "the queue the copies wait in (the consumer's input queue)")
        command.add_argument("--session", type=_name, metavar="SESSION_ID",
                             help="the session to read (required on a session-enabled queue: the orderId)")
        command.add_argument("--ids", nargs="+", default=[], type=_name, metavar="MESSAGE_ID",
                             help="only the copies of these original MessageIds")
    listing.add_argument("--json", action="store_true", help="print a JSON array instead of a table")
    sending.add_argument("--all", action="store_true", help="every waiting copy (without --ids)")


def _index_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cosmos = "--cosmos-endpoint http://127.0.0.1:8081 --cosmos-key KEY"
    index = _command(commands, "index", "move the orders container to the lean indexing policy",
                     "The timers find what they look for by type and due alone. Records a release before due"
                     " wrote carry none: backfill sets it, so that the container may then take the lean policy"
                     " (docs/operations.md).", [f"index backfill {cosmos}"])
    index_commands = index.add_subparsers(dest="index_command", required=True, metavar="COMMAND")
    backfill = _command(index_commands, "backfill", "set due on the records a release before wrote",
                        "Set due on every pending outbox entry, claim in progress and parked event that lacks it,"
                        " each on the etag it was read with; one written meanwhile is left (this release's writes"
                        " set due). Run it once every host runs this release, with the container still on the"
                        " migrating policy. Prints what it did, counted by kind.",
                        [f"index backfill {cosmos}",
                         "index backfill --cosmos-endpoint https://acct.documents.azure.com:443/   # Entra ID"],
                        exits="exit status: 0 done; 1 failed; 2 bad usage")
    parked.add_options(backfill)


def _parked_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cosmos = "--cosmos-endpoint http://127.0.0.1:8081 --cosmos-key KEY"
    parked_cmd = _command(commands, "parked", "list, release or drop parked events",
                          (parked.__doc__ or "").replace("``", ""),
                          [f"parked list {cosmos}", f"parked release --order ord-17 --event evt-3 {cosmos}"])
    parked_commands = parked_cmd.add_subparsers(dest="parked_command", required=True, metavar="COMMAND")
    listing = _command(parked_commands, "list", "list parked events (all, or one order's)",
                       "List the events parked in the orders container: order, version, type, event id, status, "
                       "age and reason.",
                       [f"parked list {cosmos}", f"parked list --order ord-17 {cosmos}",
                        "parked list --cosmos-endpoint https://acct.documents.azure.com:443/   # Entra ID"],
                       exits="exit status: 0 listed; 1 failed; 2 bad usage; 3 nothing parked")
    listing.add_argument("--order", metavar="ORDER_ID", help="only this order's")
    parked.add_options(listing)
    for name, text in (("release", "apply a parked event now, its missing predecessors notwithstanding"),
                       ("drop", "set a parked event aside for good (kept, marked dropped)")):
        command = _command(parked_commands, name, text, text[0].upper() + text[1:] + ".",
                           [f"parked {name} --order ord-17 --event evt-3 {cosmos}"],
                           exits="exit status: 0 done; 1 failed (e.g. no such parked event); 2 bad usage")
        command.add_argument("--order", required=True, type=_name, metavar="ORDER_ID", help="the orderId")
        command.add_argument("--event", required=True, type=_name, metavar="EVENT_ID", help="the parked event's id")
        parked.add_options(command)
