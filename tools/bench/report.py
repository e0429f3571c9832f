"""The benchmark's tables (Markdown), figures (JSON) and chart (PNG), and the extra measurements."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import cold_start, own_code
from bench.throughput import DUPLICATES, EVENTS, NEW, PROJECT, PROJECT_STANDIN, RAW, WORKLOADS, Cell

ROOT = Path(__file__).resolve().parents[2]  # the project root, above tools/


def line(cell: Cell) -> str:
    """One cell in one line, for progress."""
    return (f"{cell.workload}, {cell.strategy}, c{cell.concurrency}: {cell.per_second:.0f} messages/s,"
            f" {cell.requests_per_message:.2f} requests/message, p50 {cell.percentile(50):.1f} ms,"
            f" p99 {cell.percentile(99):.1f} ms, client CPU {cell.cpu_ms_per_request:.2f} ms/request")


def floor(cells: Sequence[Cell]) -> dict[str, float]:
    """The project's request counts at the lowest concurrency measured: per new order, copy, applied event."""
    def project(workload: str) -> Cell:
        return min((c for c in cells if c.strategy == PROJECT and c.workload == workload),
                   key=lambda c: c.concurrency)
    return {"new order": round(project(NEW).requests_per_message, 3),
            "copy of an order": round(project(DUPLICATES).requests_per_copy or 0.0, 3),
            "applied event": round(project(EVENTS).requests_per_message, 3)}


def extras(memory_sizes: Sequence[int]) -> dict[str, Any]:
    """Cold start (median of 10 fresh processes) and peak RSS over each number of messages."""
    print("bench: cold start, 10 fresh processes each", flush=True)
    found: dict[str, Any] = {"cold start": cold_start.measure(10), "own code": own_code.measure()}
    memory = {}
    for size in memory_sizes:
        print(f"bench: peak memory over {size} messages", flush=True)
        run = subprocess.run([sys.executable, "-m", "bench.memory", "--messages", str(size)], cwd=ROOT,
                             capture_output=True, text=True, check=True)
        memory[str(size)] = json.loads(run.stdout.strip().splitlines()[-1])
    found["memory"] = memory
    return found


def _ratio(cells: Sequence[Cell], workload: str, concurrency: int, other: str) -> float | None:
    ours = next((c for c in cells if (c.strategy, c.workload, c.concurrency) == (PROJECT, workload, concurrency)),
                None)
    theirs = next((c for c in cells if (c.strategy, c.workload, c.concurrency) == (other, workload, concurrency)),
                  None)
    if ours is None or theirs is None or not theirs.per_second:
        return None
    return ours.per_second / theirs.per_second


def efficiency(cells: Sequence[Cell]) -> dict[str, float]:
    """Per workload at the highest concurrency: project messages/s x its requests/message over raw's messages/s."""
    top = max(c.concurrency for c in cells)
    found = {}
    for workload in WORKLOADS:
        ours = [c for c in cells if (c.strategy, c.workload, c.concurrency) == (PROJECT, workload, top)]
        raw = [c for c in cells if (c.strategy, c.workload, c.concurrency) == (RAW, workload, top)]
        if ours and raw and raw[0].per_second:
            found[workload] = round(ours[0].per_second * ours[0].requests_per_message / raw[0].per_second, 3)
    return found


def markdown(cells: Sequence[Cell], floors: dict[str, float], extra: dict[str, Any], *, endpoint: str,
             smoke: bool) -> str:
    """Every table, as Markdown."""
    levels = sorted({c.concurrency for c in cells})
    local = "127.0.0.1" in endpoint or "localhost" in endpoint
    charged = any(c.request_units is not None for c in cells)
    out = [f"Measured {datetime.now(UTC):%Y-%m-%d} on {os.cpu_count()} cores, Python {platform.python_version()},"
           f" {'the local Cosmos server' if local else endpoint}, async client (azure.cosmos.aio, asyncio tasks)"
           + (" (smoke: request counts only)" if smoke else "") + ".",
           "Request units: " + ("as reported by the endpoint." if charged else
                                "not read: the local server answers a flat 1 per request; set COSMOS_TEST_ENDPOINT"
                                " (the emulator or an account) to read them."), ""]
    out += ["**Cosmos requests per message**, counted at the HTTP transport below the SDK's retries:", "",
            "| strategy | " + " | ".join(WORKLOADS) + " | per copy (duplicates) |",
            "| --- | " + " | ".join("---" for _ in WORKLOADS) + " | --- |"]
    for strategy in dict.fromkeys(c.strategy for c in cells):
        row = []
        for workload in WORKLOADS:
            found = [c for c in cells if (c.strategy, c.workload, c.concurrency) == (strategy, workload, levels[0])]
            row.append(f"{found[0].requests_per_message:.2f}" if found else "")
        copy = [c for c in cells if (c.strategy, c.workload, c.concurrency) == (strategy, DUPLICATES, levels[0])]
        per_copy = copy[0].requests_per_copy if copy else None
        out.append(f"| {strategy} | " + " | ".join(row) + f" | {'' if per_copy is None else f'{per_copy:.2f}'} |")
    if charged:
        out += ["", "| strategy | workload | request units per message |", "| --- | --- | --- |"]
        out += [f"| {c.strategy} | {c.workload} | {(c.request_units or 0) / c.messages:.2f} |" for c in cells
                if c.concurrency == levels[0]]
    out += ["", f"The project's floor: {floors}.", ""]
    if smoke:
        return "\n".join(out)
    for workload in WORKLOADS:
        out += [f"**{workload}**: messages per second (p50 / p99 ms)", "",
                "| strategy | " + " | ".join(f"c{n}" for n in levels) + " |",
                "| --- | " + " | ".join("---" for _ in levels) + " |"]
        for strategy in dict.fromkeys(c.strategy for c in cells if c.workload == workload):
            row = []
            for level in levels:
                found = [c for c in cells if (c.strategy, c.workload, c.concurrency) == (strategy, workload, level)]
                row.append(f"{found[0].per_second:.0f} ({found[0].percentile(50):.1f} / {found[0].percentile(99):.1f})"
                           if found else "")
            out.append(f"| {strategy} | " + " | ".join(row) + " |")
        out.append("")
    top = levels[-1]
    out += [f"**Client CPU per Cosmos request** at c{top}, ms (this process; with the stand-in, its server too):",
            "", "| strategy | " + " | ".join(WORKLOADS) + " |",
            "| --- | " + " | ".join("---" for _ in WORKLOADS) + " |"]
    for strategy in dict.fromkeys(c.strategy for c in cells):
        at_top = {c.workload: c for c in cells if c.strategy == strategy and c.concurrency == top}
        out.append(f"| {strategy} | " + " | ".join(f"{at_top[w].cpu_ms_per_request:.2f}" if w in at_top else ""
                                                   for w in WORKLOADS) + " |")
    out += ["", "**This project's throughput as a ratio of each alternative's**, same run:", "",
            "| against | workload | " + " | ".join(f"c{n}" for n in levels) + " |",
            "| --- | --- | " + " | ".join("---" for _ in levels) + " |"]
    for other in dict.fromkeys(c.strategy for c in cells if c.strategy not in (PROJECT, PROJECT_STANDIN)):
        for workload in WORKLOADS:
            ratios = [_ratio(cells, workload, level, other) for level in levels]
            if any(r is not None for r in ratios):
                out.append(f"| {other} | {workload} | "
                           + " | ".join("" if r is None else f"{r:.2f}x" for r in ratios) + " |")
    out += ["", f"Per-request efficiency at c{levels[-1]} (this project's messages/s x requests/message, over raw"
            f" create's messages/s): {efficiency(cells)}.", ""]
    if extra:
        out += _extra_lines(extra)
    return "\n".join(out)


def _extra_lines(extra: dict[str, Any]) -> list[str]:
    """Cold start, proxy look-ups, async, memory and the stand-ins, a sentence each."""
    out: list[str] = []
    start = extra["cold start"]
    out.append(f"Cold start, median of 10 fresh processes: `import function_app` {start['app_s'] * 1000:.0f} ms,"
               f" a minimal SDK-type Service Bus app {start['minimal_s'] * 1000:.0f} ms: {start['ratio']:.2f}x."
               f" The first invocation then imports the async clients (aiohttp, azure.cosmos.aio): with those,"
               f" {start['first_invocation_s'] * 1000:.0f} ms, {start['first_invocation_ratio']:.2f}x. The payments"
               f" example, on the library's blueprint: {start['payments_s'] * 1000:.0f} ms,"
               f" {start['payments_ratio']:.2f}x.")
    own = extra["own code"]
    out.append(f"The project's own code (bench/own_code.py: the handlers over ports that answer at once):"
               f" {own['new order ms']:.3f} ms of CPU per new order, {own['applied event ms']:.3f} ms per event.")
    memory = extra["memory"]
    out.append("Peak RSS of the project's path (new orders, c1): "
               + ", ".join(f"{int(n):,} messages {m['peak_rss_mb']:.1f} MB" for n, m in memory.items()) + ".")
    if proxy := extra.get("proxy look-ups"):
        out.append(f"Proxy look-ups per request (the full order path, c1, {proxy['environment variables']}"
                   f" environment variables): on {proxy['on messages/s']} messages/s, off"
                   f" {proxy['off messages/s']}: {proxy['off / on']:.2f}x.")
    if asynchronous := extra.get("async"):
        out.append("Async against sync, the order path's requests with azure.cosmos.aio tasks against the sync"
                   " client on threads (bench/aio.py): " + "; ".join(
                       f"{level}: {f['async messages/s']} against {f['sync messages/s']} messages/s,"
                       f" {f['async / sync']:.2f}x, p99 {f['p99 async / sync']:.2f}x"
                       for level, f in asynchronous.items()) + ".")
    sizes = sorted(memory, key=int)
    out.append(f"The local server's batch, median of the first and last 1,000 of {int(sizes[-1]):,} orders:"
               f" {memory[sizes[-1]]['first_ms']:.2f} ms and {memory[sizes[-1]]['last_ms']:.2f} ms per message;"
               f" one fulfilment call to the stand-in: {memory[sizes[-1]]['fulfilment_ms']:.2f} ms (median).")
    return out


def write(cells: Sequence[Cell], floors: dict[str, float], extra: dict[str, Any], results: Path, *,
          endpoint: str, smoke: bool) -> None:
    """bench.md, bench.json and (unless smoke) bench.png."""
    results.mkdir(parents=True, exist_ok=True)
    (results / "bench.md").write_text(markdown(cells, floors, extra, endpoint=endpoint, smoke=smoke) + "\n")
    figures = {
        "measured": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(), "python": platform.python_version(),
        "floor": floors, "efficiency": efficiency(cells) if not smoke else {}, **extra,
        "cells": [{"strategy": c.strategy, "workload": c.workload, "concurrency": c.concurrency,
                   "messages": c.messages, "seconds": round(c.seconds, 3), "messages per second":
                   round(c.per_second, 1), "requests per message": round(c.requests_per_message, 3),
                   "requests per copy": c.requests_per_copy, "request units": c.request_units,
                   "p50 ms": round(c.percentile(50), 2), "p99 ms": round(c.percentile(99), 2),
                   "client CPU ms per request": round(c.cpu_ms_per_request, 3)} for c in cells],
    }
    (results / "bench.json").write_text(json.dumps(figures, indent=2))
    if not smoke:
        _chart(cells, results / "bench.png")


def _chart(cells: Sequence[Cell], path: Path) -> None:
    import matplotlib  # noqa: PLC0415 - only the full run draws

    matplotlib.use("Agg")
    from matplotlib import pyplot  # noqa: PLC0415

    top = max(c.concurrency for c in cells)
    strategies = list(dict.fromkeys(c.strategy for c in cells))
    figure, (speed, wire) = pyplot.subplots(1, 2, figsize=(13, 5))
    width = 0.8 / len(strategies)
    for index, strategy in enumerate(strategies):
        mine = {c.workload: c for c in cells if c.strategy == strategy and c.concurrency == top}
        xs = [w + index * width for w in range(len(WORKLOADS))]
        speed.bar(xs, [mine[w].per_second if w in mine else 0 for w in WORKLOADS], width, label=strategy)
        wire.bar(xs, [mine[w].requests_per_message if w in mine else 0 for w in WORKLOADS], width, label=strategy)
    for axis, label in ((speed, f"messages per second at c{top}"), (wire, "Cosmos requests per message")):
        axis.set_xticks([w + 0.4 - width / 2 for w in range(len(WORKLOADS))], WORKLOADS)
        axis.set_ylabel(label)
    handles, labels = speed.get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncols=len(strategies), fontsize="small")
    figure.tight_layout(rect=(0, 0.06, 1, 1))  # the legend below both panels, clear of the bars
    figure.savefig(path, dpi=100)
    pyplot.close(figure)

