"""``python -m bench.lines`` counts code, not blank lines, comments or docstrings; and the payments example stays a
consumer of about 30 lines."""

from __future__ import annotations

from bench import lines

SOURCE = '''"""A module's docstring,
on two lines."""

import os  # a comment after code counts as code


class Thing:
    """A class's docstring."""

    # a comment on its own
    def method(self) -> str:
        """A function's docstring."""
        return (
            "a string spread"
            " over lines"
        )
'''


def test_code_lines_leave_out_blank_lines_comments_and_docstrings() -> None:
    assert lines.code_lines(SOURCE) == 7  # import, class, def, return ( , two strings, )


def test_the_payments_example_is_a_consumer_of_at_most_30_lines() -> None:
    files, code = lines.count(lines.PARTS["the payments example (examples/payments/function_app.py)"])
    assert files == 1 and 15 < code <= 30
