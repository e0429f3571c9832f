"""A reading of the small part of KQL (Kusto) the workbook's queries use, to run them over the app's own log records.

Azure Monitor runs the workbook's queries over Application Insights' ``traces``; nothing here can reach it. So
the queries are written in a small subset, which this module evaluates over rows (``timestamp``, ``message``,
``severityLevel``), for the test that each query finds what the app logs, and for the picture of the workbook
drawn from the demo's records (``python -m demo.workbook``). Anything outside the subset is refused, naming it:

    traces
    | where message startswith "delivery " and severityLevel >= 2          (and-joined; also contains, ==, in)
    | parse message with "delivery " function " outcome=" outcome:string " " *    (literals, columns, *)
    | extend reason = case(outcome == "invalid", "InvalidMessage", "")    (case, strcat, toreal of columns)
    | where reason != ""
    | summarize count() by bin(timestamp, 5m), series                     (count(), percentile(col, n))
    | order by timestamp asc
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

Row = dict[str, Any]
_LITERAL = r'"(?:[^"\\]|\\.)*"'
_SPAN = re.compile(r"^(\d+)([smhd])$")


class Unsupported(ValueError):
    """A query outside the subset this module reads."""


def run(query: str, rows: Iterable[Row]) -> list[Row]:
    """The query's result over ``rows`` (the ``traces`` table)."""
    stages = [stage.strip() for stage in _split_pipes(query)]
    if stages[0] != "traces":
        raise Unsupported(f"a query must start from traces, not {stages[0]!r}")
    table = [dict(row) for row in rows]
    for stage in stages[1:]:
        verb, _, rest = stage.partition(" ")
        handler = _VERBS.get(verb)
        if handler is None:
            raise Unsupported(f"the verb {verb!r} ({stage!r})")
        table = handler(rest.strip(), table)
    return table


def _split_pipes(query: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    for char in query:
        if char == '"':
            quoted = not quoted
        if char == "|" and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [" ".join(p.split()) for p in parts if p.strip()]


def _split_top(text: str, separator: str) -> list[str]:
    """``text`` split at ``separator`` outside quotes and parentheses."""
    parts, current, depth, quoted, i = [], "", 0, False, 0
    while i < len(text):
        char = text[i]
        if char == '"':
            quoted = not quoted
        elif not quoted and char == "(":
            depth += 1
        elif not quoted and char == ")":
            depth -= 1
        if not quoted and depth == 0 and text.startswith(separator, i):
            parts.append(current)
            current, i = "", i + len(separator)
            continue
        current += char
        i += 1
    parts.append(current)
    return [p.strip() for p in parts]


def _string(text: str) -> str:
    if not re.fullmatch(_LITERAL, text):
        raise Unsupported(f"expected a string literal, not {text!r}")
    return text[1:-1].replace('\\"', '"')


def _predicate(text: str) -> Callable[[Row], bool]:
    if (m := re.fullmatch(rf"(\w+) (startswith|contains|==|!=) ({_LITERAL})", text)) is not None:
        column, op, value = m.group(1), m.group(2), _string(m.group(3))

        def compare(row: Row) -> bool:
            actual = row.get(column)
            if op == "==":
                return actual == value
            if op == "!=":
                return actual != value
            text = str(actual or "").lower()  # KQL's startswith and contains ignore case
            return text.startswith(value.lower()) if op == "startswith" else value.lower() in text
        return compare
    if (m := re.fullmatch(r"(\w+) in \((.*)\)", text)) is not None:
        column, values = m.group(1), {_string(v) for v in _split_top(m.group(2), ",")}
        return lambda row: row.get(column) in values
    if (m := re.fullmatch(r"(\w+) >= (\d+)", text)) is not None:
        column, bound = m.group(1), int(m.group(2))
        return lambda row: isinstance(row.get(column), int | float) and row[column] >= bound
    if (m := re.fullmatch(r"isnotnull\((\w+)\)", text)) is not None:
        column = m.group(1)
        return lambda row: row.get(column) is not None
    raise Unsupported(f"the condition {text!r}")


def _where(text: str, table: list[Row]) -> list[Row]:
    predicates = [_predicate(clause) for clause in _split_top(text, " and ")]
    return [row for row in table if all(p(row) for p in predicates)]


def _parse(text: str, table: list[Row]) -> list[Row]:
    """``parse <column> with <literals, columns and *>``: rows whose column does not match get nulls, as in KQL."""
    m = re.fullmatch(r"(\w+) with (.*)", text)
    if m is None:
        raise Unsupported(f"parse {text!r}")
    source, tokens = m.group(1), re.findall(rf"{_LITERAL}|\*|\w+(?::\w+)?", m.group(2))
    pattern, columns = "^", []
    for token in tokens:
        if token.startswith('"'):
            pattern += re.escape(_string(token))
        elif token == "*":  # noqa: S105 - the wildcard of a parse pattern
            pattern += ".*?"
        else:
            name, _, kind = token.partition(":")
            columns.append((name, kind or "string"))
            pattern += f"(?P<{name}>.*?)"
    compiled = re.compile(pattern + ("" if tokens and tokens[-1] == "*" else "$"), re.DOTALL)
    for row in table:
        found = compiled.match(str(row.get(source) or ""))
        for name, kind in columns:
            value = found.group(name) if found else None
            row[name] = _typed(value, kind)
    return table


def _typed(value: str | None, kind: str) -> Any:
    if value is None:
        return None
    if kind == "string":
        return value
    if kind == "real":
        try:
            return float(value)
        except ValueError:
            return None
    raise Unsupported(f"the column type {kind!r}")


def _expression(text: str) -> Callable[[Row], Any]:
    if re.fullmatch(_LITERAL, text):
        value = _string(text)
        return lambda row: value
    if re.fullmatch(r"\w+", text):
        return lambda row: row.get(text)
    if (m := re.fullmatch(r"(\w+)\((.*)\)", text)) is not None:
        name = m.group(1)
        if name == "case":
            raw = _split_top(m.group(2), ",")
            pairs = [(_predicate(raw[i]), _expression(raw[i + 1])) for i in range(0, len(raw) - 1, 2)]
            otherwise = _expression(raw[-1])
            return lambda row: next((value(row) for test, value in pairs if test(row)), otherwise(row))
        arguments = [_expression(a) for a in _split_top(m.group(2), ",")]
        if name == "strcat":
            return lambda row: "".join(str(a(row) if a(row) is not None else "") for a in arguments)
        if name == "toreal":
            return lambda row: _typed(None if arguments[0](row) is None else str(arguments[0](row)), "real")
    raise Unsupported(f"the expression {text!r}")


def _extend(text: str, table: list[Row]) -> list[Row]:
    for assignment in _split_top(text, ","):
        name, _, expression = assignment.partition(" = ")
        evaluate = _expression(expression.strip())
        for row in table:
            row[name.strip()] = evaluate(row)
    return table


def _summarize(text: str, table: list[Row]) -> list[Row]:
    aggregates, _, by = text.partition(" by ")
    keys: list[tuple[str, Callable[[Row], Any]]] = []
    for term in _split_top(by, ",") if by else []:
        if (m := re.fullmatch(r"bin\((\w+), (\w+)\)", term)) is not None:
            keys.append((m.group(1), _binned(m.group(1), _span(m.group(2)))))
        elif re.fullmatch(r"\w+", term):
            keys.append((term, _column(term)))
        else:
            raise Unsupported(f"summarize by {term!r}")
    groups: dict[tuple[Any, ...], list[Row]] = {}
    for row in table:
        groups.setdefault(tuple(key(row) for _, key in keys), []).append(row)
    result = []
    for values, members in groups.items():
        out = dict(zip([name for name, _ in keys], values, strict=True))
        for aggregate in _split_top(aggregates, ","):
            name, _, call = aggregate.rpartition(" = ")
            call = call.strip()
            out[name or ("count_" if call == "count()" else call)] = _aggregate(call, members)
        result.append(out)
    return result


def _binned(column: str, span: timedelta) -> Callable[[Row], Any]:
    return lambda row: _bin(row.get(column), span)


def _column(column: str) -> Callable[[Row], Any]:
    return lambda row: row.get(column)


def _aggregate(call: str, rows: list[Row]) -> Any:
    if call == "count()":
        return len(rows)
    if (m := re.fullmatch(r"percentile\((\w+), (\d+)\)", call)) is not None:
        values = sorted(v for row in rows if isinstance(v := row.get(m.group(1)), int | float))
        if not values:
            return None
        rank = max(0, math.ceil(int(m.group(2)) / 100 * len(values)) - 1)  # nearest rank
        return values[rank]
    raise Unsupported(f"the aggregate {call!r}")


def _span(text: str) -> timedelta:
    m = _SPAN.fullmatch(text)
    if m is None:
        raise Unsupported(f"the timespan {text!r}")
    return timedelta(**{{"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[m.group(2)]: int(m.group(1))})


def _bin(value: Any, span: timedelta) -> Any:
    if not isinstance(value, datetime):
        return None
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    seconds = span.total_seconds()
    return epoch + timedelta(seconds=(value - epoch).total_seconds() // seconds * seconds)


def _order(text: str, table: list[Row]) -> list[Row]:
    m = re.fullmatch(r"by (\w+)(?: (asc|desc))?", text)
    if m is None:
        raise Unsupported(f"order {text!r}")
    column = m.group(1)
    return sorted(table, key=lambda row: (row.get(column) is None, row.get(column)), reverse=m.group(2) == "desc")


_VERBS: dict[str, Callable[[str, list[Row]], list[Row]]] = {
    "where": _where, "parse": _parse, "extend": _extend, "summarize": _summarize, "order": _order,
}
