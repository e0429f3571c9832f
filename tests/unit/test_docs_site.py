"""The docs build as a site (mkdocs.yml, MkDocs with Material) with --strict: a broken link, a heading
that is not there, a page the nav leaves out or a docstring the API reference cannot read fails the
test command. The reference reads the sources with griffe and imports nothing of the app, so the build
runs in .venv-docs, which holds requirements-docs.txt alone."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = ROOT / ".venv-docs" / "bin" / "mkdocs"
BUILD_SECONDS = 100
# What the API reference reads: mkdocs.yml's `paths: [.]`.
SOURCES = ("function_app.py", "consumers", "shared")

pytestmark = pytest.mark.skipif(not MKDOCS.exists(), reason=".venv-docs is missing: `make setup` installs it"
                                                           " from requirements-docs.txt")


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``project``'s mkdocs.yml into ``site``, with its output."""
    # NO_MKDOCS_2_WARNING: Material's banner about MkDocs 2 and its own end of life, printed on every build.
    return subprocess.run([str(MKDOCS), "build", "--strict", "--config-file", str(project / "mkdocs.yml"),
                           "--site-dir", str(site)],
                          cwd=project, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
                          capture_output=True, text=True, timeout=BUILD_SECONDS, check=False)


def test_the_site_builds_strictly_with_every_page_and_the_api_reference(tmp_path: Path) -> None:
    built = build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stdout + built.stderr
    pages = {page.relative_to(ROOT / "docs").with_suffix(".html") for page in (ROOT / "docs").rglob("*.md")}
    assert pages and all((tmp_path / "site" / page).is_file() for page in pages), sorted(map(str, pages))
    # The reference is read from the code: the composition root's and the delivery policy's entries.
    core = (tmp_path / "site" / "reference" / "core.html").read_text()
    assert 'id="shared.bootstrap.build"' in core and 'id="shared.delivery.run_delivery"' in core


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
