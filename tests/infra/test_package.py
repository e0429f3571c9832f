"""The deployment package: what `func azure functionapp publish` and `azd deploy` upload holds the app alone,
and installed from requirements.txt alone it indexes the five functions with the production worker library.

How the two tools build the package, read in their sources (Core Tools at 3ee97a6, 2026-08-20; azd at
ae35809, 2026-08-21), both for Flex Consumption too:

- **Core Tools** (``ZipHelper.GetAppZipFile`` -> ``FileSystemHelpers.GetLocalFiles``; for Python with a
  remote build the zip is those files and an empty ``.python_packages``) walks the project folder and
  always leaves out the folders ``.git`` and ``.vscode`` and the files ``.funcignore``, ``.gitignore``,
  ``local.settings.json`` and ``project.lock.json``, at any depth. It reads ``.funcignore`` with its own
  ``GitIgnoreParser``, a port of the npm gitignore-parser, not git's matcher: each pattern becomes a
  regex anchored at the start of the file's relative path and ended by a word boundary, so a pattern
  matches a prefix of the path from the root. ``tests`` leaves out ``tests/...``, but ``__pycache__``
  and ``*.pyc`` match at the top only: ``shared/__pycache__/*.pyc`` is uploaded.
- **azd** (``createDeployableZip``, since azure-dev#5383, June 2025) reads ``.funcignore`` as gitignore
  (``denormal/go-gitignore``), relative to the service's folder, and always leaves out ``.azure``
  folders (its environments), the ``.funcignore`` file and, for function apps, ``local.settings.json``.
  With a ``.funcignore`` present its Python defaults (skip ``__pycache__`` and virtual environments)
  no longer apply: the file has to name them, as ours does.

So the test builds both lists from the working tree: ``azd_files`` with pathspec's gitignore matcher,
``core_tools_files`` with a port of Core Tools' parser. They must agree but for bytecode caches, and hold
the app alone. Then it copies the package into a temporary folder, installs ``requirements.txt`` into a
clean virtual environment of the same Python, and there has azure-functions-runtime (the library the
3.13 worker runs) index the app through ``worker_init_request`` and ``functions_metadata_request``, as
the local host (tools/devservers/host) drives it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pathspec
import pytest

ROOT = Path(__file__).resolve().parents[2]
# The app, and the library's code, which travels with it as a folder of the app's root.
APP_TOP_LEVEL = {"function_app.py", "host.json", "requirements.txt", "consumers", "shared", "idempotent_consumer"}
LIBRARY_PROJECT_FILES = {"idempotent_consumer/pyproject.toml", "idempotent_consumer/README.md"}
TOOLS = {"devservers", "sbctl", "simulation", "demo", "chaos", "bench", "tools", "tests"}
FUNCTIONS = {  # function -> (trigger binding, its type)
    "process_order": ("msg", "serviceBusTrigger"),
    "process_order_event": ("msg", "serviceBusTrigger"),
    "publish_outbox": ("documents", "cosmosDBTrigger"),
    "sweep_outbox": ("timer", "timerTrigger"),
    "report_stuck": ("timer", "timerTrigger"),
}
# The FunctionRpc messages the worker library needs; in Azure the host's proxy worker brings them.
PROTO = ROOT / "tools" / "devservers" / "host" / "function_rpc.proto"
BYTECODE = re.compile(r"(^|/)__pycache__/|\.pyc$")
PIP_SECONDS = 240


def walk(root: Path, skip_dir: Callable[[str, str], bool], skip_file: Callable[[str, str], bool]) -> list[str]:
    """Relative paths of the files under ``root``; ``skip_*(relative path, name)`` leave some out."""
    files: list[str] = []
    for folder, dirs, names in os.walk(root):
        relative = Path(folder).relative_to(root)
        dirs[:] = [d for d in dirs if not skip_dir((relative / d).as_posix(), d)]
        files += [p for n in names if not skip_file(p := (relative / n).as_posix(), n)]
    return sorted(files)


def azd_files(root: Path = ROOT) -> list[str]:
    """What ``azd deploy`` zips for a function app: gitignore rules of ``.funcignore``, and its own exclusions."""
    spec = pathspec.GitIgnoreSpec.from_lines((root / ".funcignore").read_text().splitlines())
    return walk(root, lambda path, name: name == ".azure" or spec.match_file(f"{path}/"),
                lambda path, name: name in {".funcignore", "local.settings.json"} or spec.match_file(path))


def core_tools_accepts(funcignore: str) -> Callable[[str], bool]:
    """Core Tools' ``GitIgnoreParser.Accepts``: whether a file's relative path survives ``funcignore``."""
    positive: list[str] = []
    negative: list[str] = []
    for line in (raw.strip() for raw in funcignore.split("\n")):
        if not line or line.startswith("#"):
            continue
        kept = negative if line.startswith("!") else positive
        kept.append(line.removeprefix("!").removeprefix("/"))

    def regex(patterns: list[str]) -> re.Pattern[str]:
        if not patterns:
            return re.compile("$^")
        parts = [re.sub(r"[\-\[\]/{}()+?.\\^$|]", lambda m: "\\" + m.group(0), p).replace("**", "(.+)")
                 .replace("*", "([^\\/]+)") for p in sorted(patterns)]
        return re.compile("^((" + ")|(".join(parts) + "))\\b", re.ASCII)

    denied, kept_anyway = regex(positive), regex(negative)
    return lambda path: bool(kept_anyway.search(path)) or not denied.search(path)


def core_tools_files(root: Path = ROOT) -> list[str]:
    """What ``func azure functionapp publish`` zips: ``GetLocalFiles`` with ``.funcignore``."""
    text = (root / ".funcignore").read_text()
    accepts = core_tools_accepts(text)
    no_negation = not any(line.strip().startswith("!") for line in text.split("\n"))
    # A folder whose every file the rules deny is not walked (the same list, faster): only without negations.
    return walk(root,
                lambda path, name: name.lower() in {".git", ".vscode"} or (no_negation and not accepts(f"{path}/")),
                lambda path, name: name.lower() in {".funcignore", ".gitignore", "local.settings.json",
                                                    "project.lock.json"} or not accepts(path))


def test_the_package_holds_the_app_and_nothing_else() -> None:
    files = azd_files()
    assert {f.split("/", 1)[0] for f in files} == APP_TOP_LEVEL, files
    assert "function_app.py" in files and "host.json" in files
    assert "idempotent_consumer/py.typed" in files and not LIBRARY_PROJECT_FILES & set(files)


def test_core_tools_uploads_the_same_files_but_bytecode_caches() -> None:
    # Its parser anchors every pattern at the root: `__pycache__` and `*.pyc` in .funcignore leave out
    # ./__pycache__ alone, so the caches inside consumers/ and shared/ go up too (harmless, not the app's).
    core, azd = set(core_tools_files()), set(azd_files())
    assert {f.split("/", 1)[0] for f in core} == APP_TOP_LEVEL
    assert not azd - core
    assert all(BYTECODE.search(path) for path in core - azd), sorted(core - azd)


def test_no_module_in_the_package_imports_a_tool() -> None:
    for name in azd_files():
        if name.endswith(".py"):
            tree = ast.parse((ROOT / name).read_text())
            imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
            imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
            assert not [m for m in imported if m.split(".")[0] in TOOLS], (name, imported)


def _tree(root: Path, names: list[str]) -> None:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")


def test_the_package_rules_find_a_tool_left_in(tmp_path: Path) -> None:
    # The check must be able to fail: a folder .funcignore forgets is packaged, by both tools.
    (tmp_path / ".funcignore").write_text("tests\n")
    _tree(tmp_path, ["function_app.py", "host.json", "tests/test_x.py", "tools/sbctl/cli.py"])
    assert azd_files(tmp_path) == core_tools_files(tmp_path) == ["function_app.py", "host.json", "tools/sbctl/cli.py"]


def test_the_two_readings_of_funcignore_differ_where_the_tools_do(tmp_path: Path) -> None:
    (tmp_path / ".funcignore").write_text("__pycache__\n*.pyc\ndocs\n")
    _tree(tmp_path, ["app.py", "docs/a.md", "docsy.txt", "pkg/__pycache__/m.pyc", "pkg/m.pyc", "__pycache__/t.pyc",
                     "local.settings.json", "pkg/.gitignore", ".azure/dev/.env", ".vscode/settings.json"])
    # azd: gitignore rules at any depth, and .azure and local.settings.json always out.
    assert azd_files(tmp_path) == [".vscode/settings.json", "app.py", "docsy.txt", "pkg/.gitignore"]
    # Core Tools: rules anchored at the root (so nested caches go up, and .azure unless listed), and
    # .vscode, .gitignore and local.settings.json always out.
    assert core_tools_files(tmp_path) == [".azure/dev/.env", "app.py", "docsy.txt", "pkg/__pycache__/m.pyc",
                                          "pkg/m.pyc"]


PROBE = '''
"""Index the app as the Python 3.13 worker does, in a virtual environment that holds requirements.txt alone."""
import asyncio
import importlib.util
import json
import sys
import types

app, proto_dir, tools = sys.argv[1], sys.argv[2], sys.argv[3].split(",")

import grpc  # the host's proxy worker brings the FunctionRpc protos; grpcio-tools (the extension's) compiles ours

sys.path.insert(0, proto_dir)
messages, services = grpc.protos_and_services("function_rpc.proto")
sys.path.remove(proto_dir)
protos = types.ModuleType("protos")
for module in (messages, services):
    protos.__dict__.update({k: v for k, v in vars(module).items() if not k.startswith("_")})

sys.path.insert(0, app)  # the proxy worker puts the app's folder first
import azure_functions_runtime as runtime


class Request:
    def __init__(self, request, properties=None):
        self.request, self.properties = request, properties


async def index():
    init = protos.StreamingMessage(worker_init_request=protos.WorkerInitRequest(function_app_directory=app))
    response = await runtime.worker_init_request(Request(init, {"protos": protos, "host": "127.0.0.1"}))
    asked = protos.StreamingMessage(functions_metadata_request=protos.FunctionsMetadataRequest(
        function_app_directory=app))
    return response, await runtime.functions_metadata_request(Request(asked))


response, metadata = asyncio.run(index())
direction = protos.BindingInfo.Direction.Name
print("INDEXED " + json.dumps({
    "init": protos.StatusResult.Status.Name(response.result.status),
    "error": response.result.exception.message,
    "functions": {f.name: {"bindings": {name: {"type": b.type, "direction": direction(b.direction)}
                                        for name, b in f.bindings.items()},
                           "raw": [json.loads(raw) for raw in f.raw_bindings]}
                  for f in metadata.function_metadata_results or []},
    "modules": sorted({m.__file__ for m in list(sys.modules.values()) if getattr(m, "__file__", None)}),
    "tools": [name for name in tools if importlib.util.find_spec(name) is not None],
    "version": list(sys.version_info[:2]),
    "prefix": sys.prefix,
    "base_prefix": sys.base_prefix,
}))
'''


def _run(command: list[str | Path], *, timeout: float, **options: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=timeout, check=False,
                          **options)


def index_unreachable() -> str | None:
    """Why pip's index does not answer, or None when it does (then a failed install is the package's fault).
    pip -q reports an unreachable index as "No matching distribution", like a wrong pin, so ask it directly."""
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/").rstrip("/")
    try:
        with urllib.request.urlopen(f"{index}/pip/", timeout=15):
            return None
    except (OSError, ValueError) as exc:
        return f"{index}: {exc}"


def index_in_a_clean_venv(work: Path) -> dict[str, Any]:
    """The package copied out, requirements.txt installed into a clean venv, and what the worker library indexed."""
    app, host, venv = work / "app", work / "host", work / "venv"
    for name in azd_files():
        (app / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, app / name)
    host.mkdir()
    shutil.copy2(PROTO, host / PROTO.name)
    made = _run([sys.executable, "-m", "venv", venv], timeout=120)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    # pip's own cache (~/.cache/pip) is used when there is one; a short timeout finds an unreachable index fast.
    # --no-compile: the probe imports with -B and compiles only what it imports; compiling every installed package
    # was a third of the install's CPU (6 of 17 s here), and is not what this test checks.
    installed = _run([python, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-compile", "--timeout",
                      "20", "--retries", "1", "-r", app / "requirements.txt"], timeout=PIP_SECONDS)
    if installed.returncode != 0:
        if (unreachable := index_unreachable()) is not None:
            pytest.skip(f"PyPI is unreachable from here ({unreachable}): the package test installs requirements.txt"
                        " from it, its one external endpoint")
        pytest.fail(f"pip install -r requirements.txt failed in a clean venv:\n{installed.stderr[-3000:]}")
    files = sorted(p.relative_to(app).as_posix() for p in app.rglob("*") if p.is_file())
    (work / "probe.py").write_text(PROBE)
    # -I: no PYTHONPATH, no user site, not even the script's folder on sys.path; -B: no bytecode written into
    # the package; the app's folder as the cwd.
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work),
                   "FUNCTIONS_WORKER_RUNTIME": "python"}
    probe = _run([python, "-I", "-B", work / "probe.py", app, host, ",".join(sorted(TOOLS))], timeout=120, cwd=app,
                 env=environment)
    lines = [line for line in probe.stdout.splitlines() if line.startswith("INDEXED ")]
    assert probe.returncode == 0 and lines, probe.stdout + probe.stderr
    return {**json.loads(lines[-1].removeprefix("INDEXED ")), "app": str(app), "files": files}


# One test, so that the venv is built once whichever xdist worker runs it: a minute or so on a fresh
# machine, seconds with pip's cache.
@pytest.mark.timeout(PIP_SECONDS + 120)
@pytest.mark.skipif(sys.version_info < (3, 13), reason="azure-functions-runtime, the 3.13 worker library, needs 3.13")
def test_the_package_alone_installs_and_indexes_the_five_functions(tmp_path: Path) -> None:
    indexed = index_in_a_clean_venv(tmp_path)
    # What was copied, and so all the worker could import from the project: the app alone.
    assert indexed["files"] == azd_files()
    assert {f.split("/", 1)[0] for f in indexed["files"]} == APP_TOP_LEVEL
    # The same Python, and none of tools/ or tests/ importable there.
    assert indexed["version"] == list(sys.version_info[:2])
    assert indexed["tools"] == []
    outside = [m for m in indexed["modules"]
               if not m.startswith((indexed["prefix"], indexed["base_prefix"], indexed["app"] + os.sep))]
    assert [Path(m).name for m in outside] == ["probe.py"], outside
    assert not [m for m in indexed["modules"] if m.startswith(str(ROOT) + os.sep)]
    # The five functions, each with its trigger, as the host would receive them.
    assert indexed["init"] == "Success", indexed["error"]
    assert set(indexed["functions"]) == set(FUNCTIONS)
    for function, (binding, trigger) in FUNCTIONS.items():
        indexed_function = indexed["functions"][function]
        assert indexed_function["bindings"] == {binding: {"type": trigger, "direction": "in"}}, function
        [raw] = indexed_function["raw"]
        assert raw["type"] == trigger and raw["name"] == binding, function
        if trigger == "serviceBusTrigger":  # the SDK-type binding, settled by the function
            assert raw["autoCompleteMessages"] is False and raw["properties"] == {"SupportsDeferredBinding": True}
            assert raw.get("isSessionsEnabled", False) is (function == "process_order_event"), function
