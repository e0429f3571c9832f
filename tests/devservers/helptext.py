"""Reading argparse's --help output: which options have no help text."""

from __future__ import annotations


def options_without_help(text: str) -> list[str]:
    """Option lines of argparse's help that have no text, neither beside them nor on the next line."""
    lines = text.split("\n\n", 1)[1].splitlines()  # after the usage block
    bare = []
    for number, line in enumerate(lines):
        stripped = line.strip()
        if not stripped.startswith("-"):
            continue
        beside = "  " in stripped  # argparse puts the help two or more spaces after the option
        following = lines[number + 1] if number + 1 < len(lines) else ""
        below = _indent(following) > _indent(line) and not following.strip().startswith("-")
        if not (beside or below):
            bare.append(stripped)
    return bare


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())
