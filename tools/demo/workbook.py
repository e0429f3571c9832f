"""``python -m demo.workbook``: the operator's workbook drawn from a run's own records, as Azure would show it.

Reads the hosts' log a demo or chaos run keeps (``results/demo/hosts.log``), turns the app's records in it into
the rows Application Insights keeps in ``traces`` (timestamp, message), runs each panel's query of the workbook
(``infra/workbook/panels.json``, the one the Bicep deploys) over them with the small KQL reader ``demo.kql``, and
draws the panels as the workbook does (a time chart, or bars). docs/operations.md shows the picture it makes:

    python -m demo.workbook [--logs results/demo/hosts.log] [--out docs/workbook.png] [--bin 10s]

A demo lasts minutes, not the day the workbook shows: the time charts' 5-minute bins are drawn at a bin
that gives a run about 30 points (``--bin`` sets it), the only change made to the queries. The Service Bus
dead-letter metric of the workbook is not in the log; its panel is left out here.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from demo import kql
from demo.stack import ROOT

PANELS = ROOT / "infra" / "workbook" / "panels.json"
# A worker's record as the local host logs it:
# "<time> devservers.host.channel worker [<invocation>] <category>: <message>"
_LINE = re.compile(r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ worker(?: \[\w+\])? [\w.]+: (?P<message>.*)$")


def traces(log: str) -> list[dict[str, Any]]:
    """The app's records in a hosts' log, as rows of ``traces``."""
    found = []
    for line in log.splitlines():
        if (match := _LINE.match(line)) is not None:
            at = datetime.strptime(match["at"], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)
            found.append({"timestamp": at, "message": match["message"]})
    return found


def draw(rows: list[dict[str, Any]], out: Path, panels: Path = PANELS, bin_size: str | None = None) -> int:
    """Draw every query panel over ``rows`` into ``out``, the time charts at ``bin_size`` (a KQL timespan; by
    default about a thirtieth of the records' span); how many panels were drawn."""
    import matplotlib  # noqa: PLC0415 - only the drawing needs it

    matplotlib.use("Agg")
    from matplotlib import pyplot  # noqa: PLC0415

    spec = json.loads(panels.read_text())
    shown = spec["panels"]
    figure, axes = pyplot.subplots(len(shown), 1, figsize=(11, 3.2 * len(shown)))
    size = bin_size or _bin_for(rows)
    for axis, panel in zip(axes, shown, strict=True):
        query = panel["query"].replace("bin(timestamp, 5m)", f"bin(timestamp, {size})")
        result = kql.run(query, rows)
        title = panel["title"].replace("(5 minutes)", f"({size} here)").replace(", 5 minutes)", f", {size} here)")
        axis.set_title(title, fontsize=9, loc="left")
        if not result:
            axis.text(0.5, 0.5, "no records in this run", ha="center", va="center", fontsize=9)
            axis.set_xticks([])
            axis.set_yticks([])
            continue
        if panel["visualization"] == "timechart":
            _timechart(axis, result)
        else:
            labels = [str(row.get("series")) for row in result]
            axis.barh(labels, [row["count_"] for row in result])
            axis.tick_params(labelsize=7)
    figure.suptitle(spec["title"], fontsize=11)
    figure.tight_layout(rect=(0, 0, 1, 0.985))  # room for the title above the first panel
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=90)
    return len(shown)


def _bin_for(rows: list[dict[str, Any]]) -> str:
    """A bin of whole seconds that gives the records' span about 30 points."""
    times = [row["timestamp"] for row in rows]
    span = (max(times) - min(times)).total_seconds() if times else 0.0
    return f"{max(1, round(span / 30))}s"


def _timechart(axis: Any, result: list[dict[str, Any]]) -> None:
    """One line per series: the string column names it, each number column is plotted."""
    lines: dict[str, list[tuple[datetime, float]]] = defaultdict(list)
    for row in result:
        labels = [str(v) for k, v in row.items() if k != "timestamp" and isinstance(v, str)]
        for column, value in row.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                name = " ".join([*labels, column if column != "count_" else ""]).strip() or column
                lines[name].append((row["timestamp"], float(value)))
    for name, points in sorted(lines.items()):
        points.sort()
        axis.plot([p[0] for p in points], [p[1] for p in points], label=name, linewidth=1)
    if lines:
        axis.legend(fontsize=6, ncol=3, loc="upper left")
    axis.tick_params(labelsize=7)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.workbook", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logs", type=Path, default=ROOT / "results" / "demo" / "hosts.log",
                        help="a run's hosts' log (default results/demo/hosts.log, which make demo writes)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "demo" / "workbook.png",
                        help="the picture to write (default results/demo/workbook.png)")
    parser.add_argument("--bin", dest="bin_size", help="the time charts' bin, a KQL timespan such as 10s or 1m"
                                                       " (default: about a thirtieth of the run)")
    args = parser.parse_args(argv)
    if not args.logs.is_file():
        print(f"error: no hosts' log at {args.logs}; run make demo first (it writes one)", file=sys.stderr)
        return 1
    rows = traces(args.logs.read_text())
    if not rows:
        print(f"error: {args.logs} holds no record of the app's (is it a hosts' log of the local host?)",
              file=sys.stderr)
        return 1
    drawn = draw(rows, args.out, bin_size=args.bin_size)
    print(f"demo.workbook: {drawn} panels over {len(rows)} records to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
