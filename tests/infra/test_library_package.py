"""The library is a package of its own: its project (idempotent_consumer/pyproject.toml) builds a typed wheel of
its modules alone, which imports without the app beside it; what its modules import, it declares, in ranges
that hold the versions the app's lock deploys."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import deps
import idempotent_consumer
from tests.infra.test_package import index_unreachable

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "idempotent_consumer"
PROJECT = tomllib.loads((LIBRARY / "pyproject.toml").read_text())["project"]
UV = Path(sys.executable).with_name("uv")
STDLIB = sys.stdlib_module_names | {"__future__"}


def _modules() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in LIBRARY.rglob("*.py") if "__pycache__" not in p.parts)


def _third_party_imports() -> set[str]:
    found: set[str] = set()
    for path in LIBRARY.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            found |= {n for n in names if n.split(".")[0] not in STDLIB and n.split(".")[0] != "idempotent_consumer"}
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if (why := index_unreachable()) is not None:
        pytest.skip(f"building the wheel needs its build backend (hatchling) from the package index: {why}")
    out = tmp_path_factory.mktemp("dist")
    run = subprocess.run([str(UV), "build", "--wheel", "--out-dir", str(out), str(LIBRARY)], capture_output=True,
                         text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    [built] = out.glob("*.whl")
    return built


def test_the_wheel_holds_the_librarys_modules_typed_and_nothing_else(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert wheel.name.startswith(f"azure_functions_idempotent_consumer-{idempotent_consumer.__version__}-py3-none")
    assert sorted(n for n in names if n.endswith(".py")) == _modules()
    assert "idempotent_consumer/py.typed" in names
    assert not [n for n in names if not n.startswith(("idempotent_consumer/", "azure_functions_idempotent_consumer"))]


def test_the_wheel_imports_every_module_with_no_app_beside_it(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    install = subprocess.run([str(UV), "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
                             capture_output=True, text=True, timeout=300, check=False)
    assert install.returncode == 0, install.stderr[-2000:]
    away = ("", str(ROOT), str(ROOT / "tools"))  # the app's root and the tools' folder off the path
    code = (
        "import importlib, pkgutil, sys\n"
        f"sys.path = [{str(target)!r}] + [p for p in sys.path if p not in {away!r}]\n"
        "import idempotent_consumer\n"
        f"assert idempotent_consumer.__file__.startswith({str(target)!r}), idempotent_consumer.__file__\n"
        "for m in pkgutil.walk_packages(idempotent_consumer.__path__, 'idempotent_consumer.'):\n"
        "    importlib.import_module(m.name)\n"
        "app = sorted(n for n in sys.modules if n.split('.')[0] in ('shared', 'consumers', 'function_app'))\n"
        "print(len([n for n in sys.modules if n.startswith('idempotent_consumer')]), app)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    count, app = run.stdout.split(" ", 1)
    assert int(count) == len(_modules()) and app.strip() == "[]"


def test_it_declares_what_its_modules_import() -> None:
    declared = {Requirement(r).name for r in PROJECT["dependencies"]}
    optional = {Requirement(r).name for extra in ("azure-monitor", "testing")
                for r in PROJECT["optional-dependencies"][extra]}
    distributions = {"msgspec": "msgspec", "opentelemetry": "opentelemetry-api",
                     "azure.monitor.opentelemetry.exporter": "azure-monitor-opentelemetry-exporter",
                     "opentelemetry.sdk": "opentelemetry-sdk", "azure.core": "azure-core",
                     "azure.cosmos": "azure-cosmos", "azure.servicebus": "azure-servicebus",
                     "azure.identity": "azure-identity", "aiohttp": "aiohttp", "pytest": "pytest",
                     "azure.functions": "azure-functions",
                     "azurefunctions.extensions.bindings": "azurefunctions-extensions-bindings-servicebus"}
    # aiohttp is imported by azure.core's AioHttpTransport, which the Cosmos DB adapter uses.
    needed = {next(d for prefix, d in sorted(distributions.items(), key=lambda i: -len(i[0]))
                   if name == prefix or name.startswith(f"{prefix}.")) for name in _third_party_imports()}
    assert needed | {"aiohttp"} == declared | optional


def test_its_ranges_hold_the_versions_the_apps_lock_deploys() -> None:
    pins = {pin.name: pin.version for pin in deps.read_lock(deps.LOCK.read_text())}
    for text in [*PROJECT["dependencies"], *PROJECT["optional-dependencies"]["azure-monitor"]]:
        requirement = Requirement(text)
        assert requirement.specifier.contains(pins[requirement.name], prereleases=True), (text, pins[requirement.name])


def test_its_version_is_the_one_place_it_is_written() -> None:
    assert PROJECT["dynamic"] == ["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", idempotent_consumer.__version__)
