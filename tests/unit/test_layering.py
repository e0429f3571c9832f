"""The core knows nothing of Azure Functions; only the Cosmos adapter imports azure.cosmos."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def core_modules() -> list[Path]:
    modules = sorted((ROOT / "shared").glob("*.py"))
    assert modules, "the core package should not be empty"
    return modules


def test_core_never_imports_azure_functions_or_the_binding_extension() -> None:
    for path in core_modules():
        for name in imported_modules(path):
            assert not name.startswith(("azure.functions", "azurefunctions")), f"{path.name} imports {name}"
            assert not name.startswith("consumers"), f"{path.name} imports {name}"


def test_only_the_cosmos_adapter_imports_azure_cosmos() -> None:
    importers = {p.name for p in core_modules() if any(n.startswith("azure.cosmos") for n in imported_modules(p))}
    consumers = {p.name for p in (ROOT / "consumers").glob("*.py")
                 if any(n.startswith("azure.cosmos") for n in imported_modules(p))}
    assert importers == {"cosmos_store.py"}
    assert consumers == set()


def test_function_app_only_registers_blueprints() -> None:
    tree = ast.parse((ROOT / "function_app.py").read_text())
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    assert functions == []
