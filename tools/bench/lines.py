"""How much code each part is: the library, the order app on it, the payments example, counted apart.

A line of code is a line with a token on it that is neither a comment nor part of a docstring (a module's,
a class's or a function's): blank lines, comments and docstrings are not counted. Tests and tools are not
counted either.

    python -m bench.lines
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the project root, above tools/
# Each part and the files it is made of.
PARTS: dict[str, tuple[str, ...]] = {
    "the library (idempotent_consumer/)": ("idempotent_consumer/**/*.py",),
    "  of which its testing kit (testing/)": ("idempotent_consumer/testing/*.py",),
    "the order app (function_app.py, consumers/, shared/)": ("function_app.py", "consumers/**/*.py",
                                                             "shared/**/*.py"),
    "the payments example (examples/payments/function_app.py)": ("examples/payments/function_app.py",),
}


def code_lines(source: str) -> int:
    """The lines of ``source`` with code on them: not blank, not only a comment, not in a docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    lines: set[int] = set()
    ignored = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
               tokenize.ENDMARKER)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in ignored:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def count(patterns: tuple[str, ...]) -> tuple[int, int]:
    """The files the patterns name under the root, and their lines of code."""
    files = sorted({path for pattern in patterns for path in ROOT.glob(pattern)})
    return len(files), sum(code_lines(path.read_text()) for path in files)


def main() -> None:
    """Print one line per part: files and lines of code."""
    width = max(map(len, PARTS))
    for part, patterns in PARTS.items():
        files, lines = count(patterns)
        print(f"{part:<{width}}  {files:>3} files  {lines:>6,} lines of code")


if __name__ == "__main__":
    main()
