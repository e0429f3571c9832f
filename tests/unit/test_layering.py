"""The layout keeps its dependency rule, and no two modules have names a newcomer could confuse."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("domain", "ports", "handlers", "adapters")
TOOLS = tuple(p.name for p in (ROOT / "tools").iterdir() if (p / "__init__.py").exists())


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)  # and each name under it, so that "from shared import adapters" counts
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def modules(package: str) -> list[Path]:
    found = sorted((ROOT / package).rglob("*.py"))
    assert found, f"{package} should not be empty"
    return found


def importers(package: str, prefix: str) -> set[str]:
    found = (p for p in modules(package) if any(n.startswith(prefix) for n in imported_modules(p)))
    return {str(p.relative_to(ROOT)) for p in found}


def test_core_never_imports_azure_functions_the_binding_extension_consumers_or_devservers() -> None:
    for path in modules("shared"):
        for name in imported_modules(path):
            assert not name.startswith(("azure.functions", "azurefunctions", "consumers", "devservers")), (path, name)


def test_the_app_imports_no_tool() -> None:
    assert set(TOOLS) >= {"devservers", "sbctl", "simulation", "demo", "chaos", "bench"}
    for path in [*modules("shared"), *modules("consumers"), ROOT / "function_app.py"]:
        for name in imported_modules(path):
            assert name.split(".")[0] not in TOOLS, (path, name)


ADAPTERS = ("shared.adapters", "idempotent_consumer.adapters")


def test_only_the_composition_root_imports_an_adapter() -> None:
    # Everything else reaches the adapters through the order app's bootstrap.build or a library consumer's Runtime,
    # or is handed ports.
    outside = [p for p in [*modules("shared"), *modules("consumers"), *modules("idempotent_consumer"),
                           ROOT / "function_app.py"] if "adapters" not in p.relative_to(ROOT).parts]
    found = {str(p.relative_to(ROOT)) for p in outside
             if any(n == a or n.startswith(f"{a}.") for n in imported_modules(p) for a in ADAPTERS)}
    # idempotent_consumer/http.py is the library's HTTP client for effects, an adapter itself: it takes the bearer
    # token's adapter when a call names a scope, on its construction.
    assert found == {"shared/bootstrap.py", "idempotent_consumer/runtime.py", "idempotent_consumer/http.py"}


def test_domain_imports_no_port_handler_adapter_or_sdk() -> None:
    for path in modules("shared/domain"):
        for name in imported_modules(path):
            assert not name.startswith(("shared.ports", "shared.handlers", *ADAPTERS, "azure")), (path, name)


def test_handlers_and_ports_import_no_adapter() -> None:
    for package in ("shared/handlers", "shared/ports", "idempotent_consumer/ports"):
        assert all(importers(package, adapters) == set() for adapters in ADAPTERS)
        assert importers(package, "azure") == set()


def test_only_the_cosmos_adapter_imports_azure_cosmos() -> None:
    assert importers("idempotent_consumer", "azure.cosmos") == {"idempotent_consumer/adapters/cosmos.py"}
    assert importers("shared", "azure.cosmos") == importers("consumers", "azure.cosmos") == set()


def test_only_the_servicebus_adapter_and_the_binding_translation_import_azure_servicebus() -> None:
    assert importers("idempotent_consumer", "azure.servicebus") == {"idempotent_consumer/adapters/servicebus.py",
                                                                   "idempotent_consumer/functions/binding.py"}
    assert importers("shared", "azure.servicebus") == importers("consumers", "azure.servicebus") == set()


def test_the_core_reaches_services_through_async_clients_only() -> None:
    # The functions run on the worker's one event loop: one blocking call would stall every delivery on it.
    clients = {"CosmosClient", "ContainerProxy", "ServiceBusClient", "DefaultAzureCredential", "RequestsTransport"}
    for path in modules("shared"):
        assert not any(n.split(".")[0] in {"requests", "urllib3", "http"} for n in imported_modules(path)), path
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("azure."):
                sync = {alias.name for alias in node.names} & clients
                assert not sync or (node.module or "").endswith(".aio"), (path, node.module, sync)


def test_function_app_only_registers_blueprints() -> None:
    tree = ast.parse((ROOT / "function_app.py").read_text())
    assert [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)] == []


def _one_edit_apart(a: str, b: str) -> bool:
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def test_no_two_module_names_differ_by_a_letter_or_a_suffix() -> None:
    stems = {p.stem for package in ("shared", "consumers") for p in modules(package)} - {"__init__"}
    for a, b in itertools.combinations(sorted(stems), 2):
        assert not _one_edit_apart(a, b), (a, b)
        assert not (a.startswith(b) or b.startswith(a) or a.endswith(b) or b.endswith(a)), (a, b)


def test_the_core_is_grouped_by_role() -> None:
    packages = {p.name for p in (ROOT / "shared").iterdir() if (p / "__init__.py").exists()}
    assert packages == set(LAYERS)


APP = ("shared", "consumers", "function_app", "tests")


def app_imports(path: Path) -> list[str]:
    """What a module imports of the app, its tests or a tool."""
    return sorted(n for n in imported_modules(path) if n.split(".")[0] in (*APP, *TOOLS))


def test_the_library_never_imports_the_app_its_tests_or_a_tool() -> None:
    assert {p: app_imports(p) for p in modules("idempotent_consumer") if app_imports(p)} == {}


def test_an_import_of_the_app_planted_in_a_library_module_is_found(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("from idempotent_consumer import records\nfrom shared.domain import orders\n"
                       "def f():\n    import consumers.triggers\n")
    assert app_imports(planted) == ["consumers.triggers", "shared.domain", "shared.domain.orders"]


def test_the_library_core_imports_no_sdk_of_azure_but_the_optional_exporter() -> None:
    found = {str(p.relative_to(ROOT)): sorted(n for n in imported_modules(p) if n.startswith("azure"))
             for p in modules("idempotent_consumer") if not {"adapters", "functions"} & set(p.parts)}
    assert {path: names for path, names in found.items() if names} == {
        "idempotent_consumer/telemetry.py": ["azure.monitor.opentelemetry.exporter",
                                             "azure.monitor.opentelemetry.exporter.AzureMonitorMetricExporter"]}
