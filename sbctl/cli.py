"""The sbctl command line: argument parsing, dispatch, and errors without stack traces."""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from azure.servicebus import ServiceBusClient

from sbctl import dlq, parked, schemas
from sbctl.connection import CONNECTION_ENV, ToolError, open_client
from sbctl.send import generated, read_jsonl, send, with_faults


def _rate(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError("must be between 0 and 1")
    return value


def _connection_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection")
    group.add_argument("--connection-string", help=f"Service Bus connection string (default: ${CONNECTION_ENV})")
    group.add_argument("--namespace", help="fully qualified namespace, e.g. sb-x.servicebus.windows.net; "
                                           "authenticates with DefaultAzureCredential")
    return common


def _selection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue", required=True, help="queue whose dead-letter queue to act on")
    parser.add_argument("--reason", help="only messages with this DeadLetterReason")
    parser.add_argument("--ids", nargs="+", default=[], metavar="MESSAGE_ID", help="only these MessageIds")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; every command has --help."""
    common = _connection_options()
    parser = argparse.ArgumentParser(prog="python -m sbctl", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    send_cmd = commands.add_parser("send", parents=[common], help="send orders or events",
                                   description="Send orders or events: MessageId = business id, SessionId = "
                                               "orderId for events, CorrelationId carried through.")
    send_cmd.add_argument("--queue", required=True)
    source = send_cmd.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", type=Path, help="JSON Lines: one order or event body per line, or "
                                                  '{"body": ..., "correlationId": ..., "applicationProperties": ...}')
    source.add_argument("--generate", type=int, metavar="N", help="generate N realistic messages")
    send_cmd.add_argument("--kind", choices=["orders", "events"], default="orders", help="what --generate makes")
    send_cmd.add_argument("--duplicates", type=_rate, default=0.0, metavar="RATE",
                          help="re-send an exact copy of this share of messages, as a retrying producer does")
    send_cmd.add_argument("--reuse-ids", type=_rate, default=0.0, metavar="RATE",
                          help="send other content under this share of ids (to exercise PayloadMismatch)")
    send_cmd.add_argument("--seed", type=int, default=None, help="random seed, for reproducible traffic")

    dlq_cmd = commands.add_parser("dlq", help="inspect and repair a dead-letter queue",
                                  description="List, resubmit or purge dead-lettered messages.")
    dlq_commands = dlq_cmd.add_subparsers(dest="dlq_command", required=True)
    list_cmd = dlq_commands.add_parser("list", parents=[common], help="list dead-lettered messages (peek)")
    list_cmd.add_argument("--queue", required=True)
    list_cmd.add_argument("--json", action="store_true", help="print a JSON array instead of a table")
    list_cmd.add_argument("--max", type=int, default=None, help="at most this many")
    resubmit_cmd = dlq_commands.add_parser("resubmit", parents=[common],
                                           help="send dead-lettered messages back to their queue")
    _selection_options(resubmit_cmd)
    resubmit_cmd.add_argument("--dry-run", action="store_true", help="list what would be resubmitted")
    purge_cmd = dlq_commands.add_parser("purge", parents=[common], help="delete dead-lettered messages")
    _selection_options(purge_cmd)
    purge_cmd.add_argument("--yes", action="store_true", help="don't ask for confirmation")
    parked_cmd = commands.add_parser("parked", help="list, release or drop parked events",
                                     description=parked.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parked_commands = parked_cmd.add_subparsers(dest="parked_command", required=True)
    parked_list = parked_commands.add_parser("list", help="list parked events (all, or one order's)")
    parked_list.add_argument("--order", help="only this order's")
    for name, text in (("release", "apply a parked event now, its missing predecessors notwithstanding"),
                       ("drop", "set a parked event aside for good (kept, marked dropped)")):
        command = parked_commands.add_parser(name, help=text)
        command.add_argument("--order", required=True, help="the orderId")
        command.add_argument("--event", required=True, help="the parked event's id")
    for command in (parked_list, *[parked_commands.choices[n] for n in ("release", "drop")]):
        parked.add_options(command)

    schemas_cmd = commands.add_parser("schemas", help="write the messages' JSON Schemas",
                                      description="Write the JSON Schema of each message, generated from the "
                                                  "consumer's models, for producers to validate against.")
    schemas_cmd.add_argument("--out", type=Path, default=schemas.DEFAULT_DIR, help="directory to write into")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; 0 on success, 1 on an error it explains, 2 on bad usage."""
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except ToolError as exc:
        print(f"sbctl: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("sbctl: interrupted", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    if args.command == "send":
        return _send(args)
    if args.command == "parked":
        return parked.run(args)
    if args.command == "schemas":
        for path in schemas.write(args.out):
            print(f"wrote {path}")
        return 0
    selection = dlq.Selection(getattr(args, "reason", None), frozenset(getattr(args, "ids", [])))
    with open_client(args.connection_string, args.namespace) as client:
        if args.dlq_command == "list":
            rows = dlq.peek_all(client, args.queue, limit=args.max)
            print(json.dumps([r.as_json() for r in rows], indent=2) if args.json else dlq.table(rows))
            return 0
        if args.dlq_command == "resubmit" and args.dry_run:
            rows = dlq.peek_all(client, args.queue, selection)
            print(dlq.table(rows))
            print(f"would resubmit {len(rows)} message(s) to {args.queue}", file=sys.stderr)
            return 0
        if args.dlq_command == "purge" and not args.yes and not _confirm(client, args.queue, selection):
            print("nothing deleted", file=sys.stderr)
            return 1
        act = dlq.resubmit if args.dlq_command == "resubmit" else dlq.purge
        verb = "resubmitted" if args.dlq_command == "resubmit" else "deleted"
        count = act(client, args.queue, selection, lambda row: print(f"{verb} {row.message_id}"))
        print(f"{verb} {count} message(s) from the dead-letter queue of {args.queue}", file=sys.stderr)
        return 0


def _confirm(client: ServiceBusClient, queue: str, selection: dlq.Selection) -> bool:
    count = len(dlq.peek_all(client, queue, selection))
    if count == 0:
        return False
    print(f"Delete {count} dead-lettered message(s) from {queue}? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def _send(args: argparse.Namespace) -> int:
    if args.generate is not None and args.generate < 1:
        raise ToolError("--generate needs a positive count")
    rng = random.Random(args.seed)  # noqa: S311 - test traffic, reproducible by seed; not security
    envelopes = read_jsonl(args.file) if args.file else generated(args.kind, args.generate, rng)
    if args.file and not args.file.is_file():
        raise ToolError(f"no such file: {args.file}")
    planned = with_faults(envelopes, args.duplicates, args.reuse_ids, rng)
    with open_client(args.connection_string, args.namespace) as client:
        summary = send(client, args.queue, planned, expected=args.generate)
    print(f"sent {summary.total} message(s) to {args.queue}: {summary.originals} original, "
          f"{summary.duplicates} duplicate, {summary.reused} reused id", file=sys.stderr)
    return 0
