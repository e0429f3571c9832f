"""The docs build as a site (mkdocs.yml, MkDocs with Material) with --strict: a broken link, a heading
that is not there, a page the nav leaves out or a docstring the API reference cannot read fails the
test command. The reference reads the sources with griffe and imports nothing of the app, so the build
runs in .venv-docs, which holds requirements-docs.txt alone.

The site's Markdown (Python-Markdown) reads lists more strictly than GitHub does, and a page that looks
right on GitHub can come out wrong on the site without failing the build: a list right under a line of
text runs into that paragraph, a nested item indented by GitHub's 2 spaces comes out flat (the site wants
4 per level), and a paragraph or code block of an item indented by fewer than 4 spaces drops out of the
list. The list checks below hold every page to the form both read alike; they need no .venv-docs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = ROOT / ".venv-docs" / "bin" / "mkdocs"
BUILD_SECONDS = 100
# What the API reference reads: mkdocs.yml's `paths: [.]`.
SOURCES = ("function_app.py", "consumers", "shared")

needs_mkdocs = pytest.mark.skipif(not MKDOCS.exists(), reason=".venv-docs is missing: `make setup` installs it"
                                                             " from requirements-docs.txt")

# A list item as Python-Markdown reads one: at any indent, a bullet or a number and a dot, then a space.
LIST_ITEM = re.compile(r"^( *)(?:[-*+]|\d+\.) +\S")
FENCE = re.compile(r"^ *(`{3,}|~{3,})")
HEADING = re.compile(r"^#{1,6}(?: |$)")


def list_problems(text: str, name: str) -> list[str]:
    """Where ``text`` (a page called ``name``) has a list the site renders otherwise than GitHub, as
    ``name:line: what``. Fenced code blocks are skipped; a heading may stand right above a list.

    - a list item right under a line of text that is not part of a list (an item, or a line that
      continues one without a blank line between): the site runs the list into that text;
    - a list item indented by anything but a multiple of 4 spaces: the site nests by 4 per level;
    - inside a list, a paragraph or a fenced block after a blank line indented by 1 to 3 spaces: the
      site ends the list before it."""
    problems: list[str] = []
    fence = ""  # the open fence's backticks or tildes
    after_blank, previous = True, ""
    in_run_with_item = False  # since the last blank line, a list item was seen
    in_list = False
    for number, line in enumerate(text.expandtabs(4).splitlines(), 1):
        where = f"{name}:{number}"
        if fence:
            closing = FENCE.match(line)
            if closing and closing.group(1)[0] == fence[0] and len(closing.group(1)) >= len(fence) \
                    and not line.strip().strip(fence[0]):
                fence = ""
            continue
        if not line.strip():
            after_blank, in_run_with_item = True, False
            continue
        indent = len(line) - len(line.lstrip(" "))
        item = LIST_ITEM.match(line)
        if item:
            if not after_blank and not in_run_with_item and not HEADING.match(previous):
                problems.append(f"{where}: a list right under a line of text needs a blank line before it")
            if indent % 4:
                problems.append(f"{where}: a nested list item indented {indent} spaces, not a multiple of 4")
            in_list = in_run_with_item = True
        elif HEADING.match(line) or (after_blank and indent == 0):
            in_list = False
        elif after_blank and in_list and indent < 4:
            problems.append(f"{where}: a list item's block indented {indent} spaces after a blank line, not 4")
        if opening := FENCE.match(line):
            fence = opening.group(1)
        after_blank, previous = False, line
    return problems


PLANTED = """\
# Planted

Some text:
- runs into the text
- and so does this

- an item
  - nested by 2
    - nested by 4 under it

- an item

  its paragraph, indented 2
- under that paragraph

```text
Text:
- in a fence, not a list
  - nor this
```

## A heading
- right under a heading is a list
    - nested by 4
      and continued

    its paragraph, by 4

    ```text
    its code, by 4
    ```

1. one
   - nested by 3
2. two
"""


def test_the_list_check_finds_a_planted_example_of_each() -> None:
    # The check must be able to fail: each kind of list the site renders otherwise, and nothing else.
    assert list_problems(PLANTED, "planted.md") == [
        "planted.md:4: a list right under a line of text needs a blank line before it",
        "planted.md:8: a nested list item indented 2 spaces, not a multiple of 4",
        "planted.md:13: a list item's block indented 2 spaces after a blank line, not 4",
        "planted.md:14: a list right under a line of text needs a blank line before it",
        "planted.md:34: a nested list item indented 3 spaces, not a multiple of 4",
    ]


def test_every_list_on_every_page_renders_as_a_list_on_the_site_too() -> None:
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages
    problems = [problem for page in pages
                for problem in list_problems(page.read_text(), str(page.relative_to(ROOT)))]
    assert not problems, "\n".join(problems)


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``project``'s mkdocs.yml into ``site``, with its output."""
    # NO_MKDOCS_2_WARNING: Material's banner about MkDocs 2 and its own end of life, printed on every build.
    return subprocess.run([str(MKDOCS), "build", "--strict", "--config-file", str(project / "mkdocs.yml"),
                           "--site-dir", str(site)],
                          cwd=project, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
                          capture_output=True, text=True, timeout=BUILD_SECONDS, check=False)


@needs_mkdocs
def test_the_site_builds_strictly_with_every_page_and_the_api_reference(tmp_path: Path) -> None:
    built = build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stdout + built.stderr
    pages = {page.relative_to(ROOT / "docs").with_suffix(".html") for page in (ROOT / "docs").rglob("*.md")}
    assert pages and all((tmp_path / "site" / page).is_file() for page in pages), sorted(map(str, pages))
    # The reference is read from the code: the composition root's entry, and the library's delivery policy.
    core = (tmp_path / "site" / "reference" / "core.html").read_text()
    library = (tmp_path / "site" / "reference" / "library.html").read_text()
    assert 'id="shared.bootstrap.build"' in core and 'id="idempotent_consumer.delivery.run_delivery"' in library


@needs_mkdocs
def test_a_link_to_a_missing_page_fails_the_strict_build(tmp_path: Path) -> None:
    # The check must be able to fail: the same docs and config, with one link to a page that is not there.
    project = tmp_path / "project"
    shutil.copytree(ROOT / "docs", project / "docs")
    shutil.copy2(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    for source in SOURCES:
        (project / source).symlink_to(ROOT / source)
    with (project / "docs" / "index.md").open("a") as home:
        home.write("\nSee also [the planted page](planted-missing-page.md).\n")
    built = build(project, tmp_path / "site")
    output = built.stdout + built.stderr
    assert built.returncode != 0, output
    assert "planted-missing-page.md" in output and "index.md" in output, output
