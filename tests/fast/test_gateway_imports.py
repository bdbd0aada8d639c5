"""The gateway's modules import each other in one direction only: no circle, counting the imports
under ``if TYPE_CHECKING:`` and inside functions (an ast scan of every module, no import run)."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "services" / "gateway" / "cox_gateway"


def module_of(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: str, module: str, is_package: bool = False) -> set[str]:
    """What ``module`` imports (with ``from x import y``, both x and x.y), wherever the import
    statement stands."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = f"{base}.{node.module}" if node.level and node.module else (node.module or base)
            if node.level == 0:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # from . import errors
    return found


def graph() -> dict[str, set[str]]:
    files = {module_of(p): p for p in PKG.rglob("*.py")}
    return {m: {i for i in imports(p.read_text(encoding="utf-8"), m, p.name == "__init__.py")
                if i in files and i != m} for m, p in files.items()}


def test_the_gateway_has_no_import_circle() -> None:
    edges = graph()
    assert {"cox_gateway.app", "cox_gateway.deps", "cox_gateway.routers.sessions"} <= set(edges)
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                raise AssertionError("import circle: " + " -> ".join([*path[path.index(n):], n]))
            if n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)


def test_the_scan_sees_type_only_relative_and_late_imports() -> None:
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..service import Gateway\n"
              "def f():\n    from .. import metrics\n    import cox_gateway.errors\n")
    found = imports(source, "cox_gateway.routers.x")
    assert {"cox_gateway.service", "cox_gateway.metrics", "cox_gateway.errors"} <= found
