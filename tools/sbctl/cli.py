"""The sbctl command line: dispatch, what each command reports, and errors as one line without a stack trace."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from sbctl import dlq, parked, retries, schemas
from sbctl.connection import Target, ToolError, open_client, target_of, translated
from sbctl.detection import CLOCK_MARGIN, Detection, detection, note
from sbctl.failures import first_line
from sbctl.options import Exit, build_parser
from sbctl.send import generated, generators, read_jsonl, send, with_faults

__all__ = ["Exit", "build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit status (see ``Exit``)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "send" and args.after is not None and not args.late_duplicates:
        parser.error("--after goes with --late-duplicates RATE")
    try:
        with _quiet_sdks():
            return _run(args)
    except ToolError as exc:
        print(f"sbctl: error: {exc}", file=sys.stderr)
        return Exit.FAILED
    except KeyboardInterrupt:
        print("sbctl: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    except Exception as exc:  # no rule names it: still one line, and the traceback on request
        if sys.flags.dev_mode:
            raise
        print(f"sbctl: error: unexpected {first_line(exc)} (python -X dev -m sbctl ... shows where)",
              file=sys.stderr)
        return Exit.FAILED


@contextmanager
def _quiet_sdks() -> Iterator[None]:
    """No SDK log records or warnings on stderr while a command runs: its own line says what went wrong."""
    logger = logging.getLogger("azure")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. urllib3's InsecureRequestWarning after --no-verify-tls
            yield
    finally:
        logger.setLevel(level)


def _run(args: argparse.Namespace) -> int:
    if args.command in ("parked", "index"):
        return parked.run(args)
    if args.command == "schemas":
        try:
            written = schemas.write(args.out)
        except OSError as exc:
            raise ToolError(f"cannot write the schemas to {args.out}: {exc.strerror or exc}") from None
        for path in written:
            print(f"wrote {path}")
        return Exit.DONE
    if args.command == "send":
        return _send(args)
    target = target_of(args.connection_string, args.namespace)
    if args.command == "retries":
        return _retries(args, target)
    if args.dlq_command == "list":
        return _list(args, target)
    selection = dlq.Selection(args.reason, frozenset(args.ids), copies=args.copies)
    if args.dlq_command == "resubmit":
        return _resubmit(args, target, selection)
    return _purge(args, target, selection)


def _list(args: argparse.Namespace, target: Target) -> int:
    with open_client(target) as client, translated(target, args.queue):
        rows = dlq.peek_all(client, args.queue, dlq.Selection(copies=args.copies), limit=args.max)
    print(json.dumps([r.as_json() for r in rows], indent=2) if args.json else dlq.table(rows))
    if not rows:
        print(f"the dead-letter queue of {args.queue} is empty", file=sys.stderr)
    return Exit.DONE if rows else Exit.NOTHING_MATCHED


def _retries(args: argparse.Namespace, target: Target) -> int:
    ids = frozenset(args.ids)
    if args.retries_command == "send-now" and not (ids or args.all):
        raise ToolError("retries send-now needs --ids MESSAGE_ID ... or --all")
    where = f"{args.queue}{f' session {args.session}' if args.session else ''}"
    with open_client(target) as client, translated(target, args.queue), retries.session_hints(args.queue):
        found = retries.waiting(client, args.queue, args.session, ids)
        if args.retries_command == "list":
            rows = [copy for copy, _ in found]
            print(json.dumps([r.as_json() for r in rows], indent=2) if args.json else retries.table(rows))
        else:
            retries.send_now(client, args.queue, found, lambda copy: print(f"sent now {copy.original_message_id}"
                                                                            f" (attempt {copy.attempt})"))
    missing = sorted(ids - {copy.original_message_id for copy, _ in found})
    if missing:
        print(f"no copy waiting in {where} for: {', '.join(missing)}", file=sys.stderr)
    if not found:
        print(f"nothing waits for a retry in {where}", file=sys.stderr)
        return Exit.NOTHING_MATCHED
    verb = "waiting for their retry in" if args.retries_command == "list" else "sent now to"
    print(f"{len(found)} copies {verb} {where}", file=sys.stderr)
    return Exit.DONE


def _resubmit(args: argparse.Namespace, target: Target, selection: dlq.Selection) -> int:
    found = _detection(target, args.queue, args.detection_window)
    if args.dry_run:
        return _dry_run(args, target, selection, found)
    done = _resubmit_pass(target, args.queue, selection, found)
    if done.held and args.wait:
        until = max(h.until for h in done.held)
        print(f"waiting {_seconds_until(until)} s, until {_time(until)}, for the duplicate-detection window of "
              f"{len(done.held)} held-back message(s) to pass", file=sys.stderr, flush=True)
        time.sleep(_seconds_until(until))
        again = _resubmit_pass(target, args.queue, dlq.Selection(sequence_numbers=frozenset(
            h.dead_letter.sequence_number for h in done.held if h.dead_letter.sequence_number is not None)), found)
        done = dlq.Resubmission([*done.resubmitted, *again.resubmitted], again.held)
    return _resubmit_summary(args, selection, found, done)


def _resubmit_pass(target: Target, queue: str, selection: dlq.Selection, found: Detection) -> dlq.Resubmission:
    with open_client(target) as client, translated(target, queue):
        return dlq.resubmit(
            client, queue, selection, found, report=lambda row: print(f"resubmitted {row.message_id}"),
            report_held=lambda held: print(f"held {held.dead_letter.message_id} until {_time(held.until)}"))


def _resubmit_summary(args: argparse.Namespace, selection: dlq.Selection, found: Detection,
                      done: dlq.Resubmission) -> int:
    _report_missing(args.queue, selection, done.selected)
    print(f"resubmitted {len(done.resubmitted)} message(s) from the dead-letter queue of {args.queue}",
          file=sys.stderr)
    if done.held:
        until = max(h.until for h in done.held)
        print(f"held back {len(done.held)} message(s) in the dead-letter queue until {_time(until)}: inside the "
              f"duplicate-detection window {found.describe()} of their original send, {args.queue} would drop "
              "their resubmission; run again after that time, or add --wait", file=sys.stderr)
        return Exit.HELD_BACK
    if not done.selected:
        print(f"nothing matched in the dead-letter queue of {args.queue}", file=sys.stderr)
        return Exit.NOTHING_MATCHED
    return Exit.DONE


def _dry_run(args: argparse.Namespace, target: Target, selection: dlq.Selection, found: Detection) -> int:
    with open_client(target) as client, translated(target, args.queue):
        rows = dlq.peek_all(client, args.queue, selection)
    print(dlq.table(rows))
    _report_missing(args.queue, selection, rows)
    now = datetime.now(UTC)
    holds = [until for row in rows if (until := dlq.hold_until(row, found, now)) is not None]
    held = f"; would hold back {len(holds)} until {_time(max(holds))}" if holds else ""
    print(f"would resubmit {len(rows) - len(holds)} message(s) to {args.queue}{held}", file=sys.stderr)
    return Exit.DONE if rows else Exit.NOTHING_MATCHED


def _purge(args: argparse.Namespace, target: Target, selection: dlq.Selection) -> int:
    with open_client(target) as client, translated(target, args.queue):
        if not args.yes:
            rows = dlq.peek_all(client, args.queue, selection)
            if not rows:
                _report_missing(args.queue, selection, rows)
                print(f"nothing matched in the dead-letter queue of {args.queue}", file=sys.stderr)
                return Exit.NOTHING_MATCHED
            if not _confirm(args.queue, len(rows)):
                print("nothing deleted", file=sys.stderr)
                return Exit.FAILED
        deleted = dlq.purge(client, args.queue, selection, lambda row: print(f"deleted {row.message_id}"))
    _report_missing(args.queue, selection, deleted)
    if not deleted:
        print(f"nothing matched in the dead-letter queue of {args.queue}", file=sys.stderr)
        return Exit.NOTHING_MATCHED
    print(f"deleted {len(deleted)} message(s) from the dead-letter queue of {args.queue}", file=sys.stderr)
    return Exit.DONE


def _confirm(queue: str, count: int) -> bool:
    print(f"Delete {count} dead-lettered message(s) from {queue}? [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _report_missing(queue: str, selection: dlq.Selection, found: Sequence[dlq.DeadLetter]) -> None:
    missing = selection.missing(found)
    if missing:
        reason = f" with reason {selection.reason}" if selection.reason else ""
        print(f"not found in the dead-letter queue of {queue}{reason}: {', '.join(missing)}", file=sys.stderr)


def _detection(target: Target, queue: str, given: timedelta | None) -> Detection:
    found = detection(target, queue, given)
    line = note(found, queue, given)
    if line:
        print(f"sbctl: note: {line}", file=sys.stderr)
    return found


def _send(args: argparse.Namespace) -> int:
    traffic, faults = generators(args.seed)
    envelopes = read_jsonl(args.file) if args.file else list(generated(args.kind, args.generate, traffic))
    planned = list(with_faults(envelopes, args.duplicates, args.reuse_ids, faults, args.late_duplicates,
                               reuse_ids_elsewhere=args.reuse_ids_elsewhere))
    target = target_of(args.connection_string, args.namespace)
    labels = [label for label, _ in planned]
    after = args.after
    if labels.count("duplicate") or labels.count("late"):
        found = detection(target, args.queue, args.detection_window)
        if after is None and labels.count("late"):
            after = math.ceil(((found.window if found.on and found.window else timedelta(0)) + CLOCK_MARGIN)
                              .total_seconds())
        warning = _fault_warning(args.queue, found, labels.count("duplicate"), labels.count("late"), after or 0)
        if warning:
            print(f"sbctl: warning: {warning}", file=sys.stderr)
    with open_client(target) as client, translated(target, args.queue):
        summary = send(client, args.queue, planned, late_after=after or 0)
    print(f"sent {summary.total} message(s) to {args.queue}: {summary.originals} original, "
          f"{summary.duplicates} duplicate, {summary.late} late duplicate, {summary.reused} reused id",
          file=sys.stderr)
    return Exit.DONE


def _fault_warning(queue: str, found: Detection, copies: int, late: int, after: float) -> str | None:
    """One line when copies will be dropped by the queue's duplicate detection; None when they will get through."""
    if not found.on or found.window is None:
        return None
    dropped = []
    if copies:
        dropped.append(f"the {copies} --duplicates copies, sent right after their originals,")
    if late and after < found.window.total_seconds():
        dropped.append(f"the {late} --late-duplicates copies, sent {after:g} s after them,")
    if not dropped:
        return None
    cure = "--late-duplicates RATE sends copies after the window" if copies else "leave --after out to wait it out"
    assumed = (f"; the window is assumed ({found.unread}): if {queue} has no duplicate detection, give "
               "--detection-window 0") if found.unread else ""
    return (f"{queue} drops a MessageId it saw within {found.describe()}: {' and '.join(dropped)} will not reach "
            f"the consumer ({cure}){assumed}")


def _seconds_until(moment: datetime) -> int:
    return max(0, math.ceil((moment - datetime.now(UTC)).total_seconds()))


def _time(moment: datetime) -> str:
    """UTC to the second, rounded up: the time given is never before the moment itself."""
    if moment.microsecond:
        moment += timedelta(microseconds=1_000_000 - moment.microsecond)
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")

