"""The package's import graph: no cycles (imports inside functions and ``if TYPE_CHECKING:`` ones count), no import
from a lower layer to a higher one, and the registry and the eval path stay light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import gsrecon

PACKAGE_DIR = Path(gsrecon.__file__).parent


def _modules(package_dir: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, whether it is a package's ``__init__``), for every module under ``package_dir``."""
    modules = {}
    for path in package_dir.rglob("*.py"):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def _imports(node: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement under ``node``, at any depth (inside functions and ``if TYPE_CHECKING:`` too)."""
    return [child for child in ast.walk(node) if isinstance(child, (ast.Import, ast.ImportFrom))]


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``from x import y`` counts as module ``x.y`` where that is one)."""
    modules = _modules(package_dir)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names if alias.name in modules}
                continue
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([node.module] if node.module else [])])
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    targets.add(f"{base}.{alias.name}")
                elif base in modules:
                    targets.add(base)
        graph[name] = targets - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as ``[a, b, ..., a]``, or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once fully explored
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


# The house's floors, lowest first: a module imports only modules of its own floor or below. The ground floor is the
# shared maths and plumbing; each floor above names its packages (or top-level modules) of gsrecon.
LAYERS = (
    {"__init__", "config", "registry", "plugins", "errors", "atomic", "records", "cache", "heap", "distributed"}
    | {"geometry", "cameras", "sh", "params", "io", "logging", "lpips_weights", "lpips_net", "optim", "kernels"},
    {"data"},
    {"component"},
    {"render"},
    {"model"},
    {"losses"},
    {"strategy"},
    {"export", "metrics"},
    {"engine"},
    {"hooks", "viewer"},
    {"partition", "lod", "bench", "integrations"},
    {"cli", "__main__"},
)


def floor(module: str) -> int:
    """The floor of ``module`` (a dotted name under gsrecon) in :data:`LAYERS`."""
    part = module.split(".")[1] if "." in module else "__init__"
    floors = [index for index, names in enumerate(LAYERS) if part in names]
    assert floors, f"gsrecon.{part} is on no floor of LAYERS: add it where its imports place it"
    return floors[0]


def test_the_package_has_no_import_cycle() -> None:
    cycle = find_cycle(import_graph(PACKAGE_DIR))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_module_imports_from_a_higher_floor() -> None:
    graph = import_graph(PACKAGE_DIR)
    upward = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if floor(b) > floor(a))
    assert upward == [], "imports from a lower floor to a higher one:\n" + "\n".join(upward)


def test_only_the_floors_above_the_engine_import_the_trainer() -> None:
    graph = import_graph(PACKAGE_DIR)
    importers = {module for module, targets in graph.items() if "gsrecon.engine.trainer" in targets}
    assert {module.split(".")[1] for module in importers} <= {"partition", "lod", "bench", "integrations", "cli"}, (
        importers
    )


def test_the_cycle_check_sees_lazy_relative_and_submodule_imports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pkg.sub import b\n")  # lazy, and b is a submodule
    (package / "sub" / "b.py").write_text("from ..c import value\n")  # relative
    (package / "c.py").write_text("value = 1\n")
    assert find_cycle(import_graph(package)) is None
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\nvalue = 1\n")
    assert find_cycle(import_graph(package)) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]  # type-only imports count


def _imported_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(result.stdout.split())


def test_importing_the_registries_imports_no_component() -> None:
    modules = _imported_after("import gsrecon.registry")
    assert {m for m in modules if m.startswith("gsrecon")} == {
        "gsrecon",
        "gsrecon.config",
        "gsrecon.errors",
        "gsrecon.registry",
    }
    assert "torch" not in modules


def test_the_eval_path_imports_no_trainer_hooks_strategies_or_preparation() -> None:
    modules = _imported_after("import gsrecon.engine.inference")
    heavy = ("gsrecon.engine.trainer", "gsrecon.hooks", "gsrecon.strategy", "gsrecon.data.prepare")
    assert not {m for m in modules if m.startswith(heavy)}
