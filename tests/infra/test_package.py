"""The deployment package: what `func azure functionapp publish` and `azd deploy` upload holds the app alone.

Both walk the project folder and leave out what `.funcignore` matches (gitignore patterns), so the test
builds the same file list from the working tree with pathspec's gitignore matcher.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pathspec

ROOT = Path(__file__).resolve().parents[2]
APP_TOP_LEVEL = {"function_app.py", "host.json", "requirements.txt", "consumers", "shared"}
TOOLS = {"devservers", "sbctl", "simulation", "demo", "chaos", "bench", "tools", "tests"}


def package_files(root: Path = ROOT) -> list[str]:
    """The paths, relative to ``root``, that a publish would upload."""
    spec = pathspec.GitIgnoreSpec.from_lines((root / ".funcignore").read_text().splitlines())
    files: list[str] = []
    for folder, dirs, names in os.walk(root):
        relative = Path(folder).relative_to(root)
        dirs[:] = [d for d in dirs if not spec.match_file(f"{(relative / d).as_posix()}/")]
        files += [p for n in names if not spec.match_file(p := (relative / n).as_posix())]
    return sorted(files)


def test_the_package_holds_the_app_and_nothing_else():
    files = package_files()
    assert {f.split("/", 1)[0] for f in files} == APP_TOP_LEVEL, files
    assert "function_app.py" in files and "host.json" in files


def test_no_module_in_the_package_imports_a_tool():
    for name in package_files():
        if name.endswith(".py"):
            tree = ast.parse((ROOT / name).read_text())
            imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
            imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
            assert not [m for m in imported if m.split(".")[0] in TOOLS], (name, imported)


def test_the_package_rule_finds_a_tool_left_in(tmp_path):
    # The check must be able to fail: a folder .funcignore forgets is packaged.
    (tmp_path / ".funcignore").write_text("tests\n")
    for name in ("function_app.py", "host.json", "tests/test_x.py", "tools/sbctl/cli.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert package_files(tmp_path) == [".funcignore", "function_app.py", "host.json", "tools/sbctl/cli.py"]
