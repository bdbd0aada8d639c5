"""The house's own rules, checked without a server (an ast scan, no import run):

- every service's modules import each other in one direction only: no circle, counting the
  imports under ``if TYPE_CHECKING:`` and inside functions (the runner's finer layer order is
  ``test_layers.py``);
- no class in ``services/`` is over 300 lines;
- the gateway's ``create_app`` only assembles the routers (under 60 lines);
- docs/design.md's "Where the code is" names every module of every process, and no other.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"
PACKAGES = sorted(p for p in SERVICES.glob("*/cox_*") if p.is_dir())
MAX_CLASS = 300
MAX_CREATE_APP = 60


def module_of(path: Path) -> str:
    parts = path.relative_to(path.parents[len(path.relative_to(SERVICES).parts) - 2]).with_suffix("").parts
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


def graph(package: Path) -> dict[str, set[str]]:
    files = {module_of(p): p for p in package.rglob("*.py")}
    return {m: {i for i in imports(p.read_text(encoding="utf-8"), m, p.name == "__init__.py")
                if i in files and i != m} for m, p in files.items()}


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_no_import_circle_in_a_service(package: Path) -> None:
    edges = graph(package)
    assert f"{package.name}.service" in edges
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


def test_the_gateway_graph_sees_its_routers() -> None:
    assert {"cox_gateway.app", "cox_gateway.deps", "cox_gateway.routers.sessions"} <= set(
        graph(SERVICES / "gateway" / "cox_gateway"))


def lines(node: ast.AST) -> int:
    return int(getattr(node, "end_lineno", 0)) - int(getattr(node, "lineno", 0)) + 1


def test_no_class_in_services_is_over_300_lines() -> None:
    big = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines(node)} lines)"
           for path in sorted(SERVICES.rglob("*.py")) for node in ast.walk(ast.parse(path.read_text()))
           if isinstance(node, ast.ClassDef) and lines(node) > MAX_CLASS]
    assert not big, f"classes over {MAX_CLASS} lines (split them by responsibility): {big}"


def test_create_app_only_assembles() -> None:
    found = [n for path in (SERVICES / "gateway" / "cox_gateway").rglob("*.py")
             for n in ast.walk(ast.parse(path.read_text()))
             if isinstance(n, ast.FunctionDef) and n.name == "create_app"]
    assert len(found) == 1
    assert lines(found[0]) < MAX_CREATE_APP, f"create_app is {lines(found[0])} lines: routes belong in routers/"


def test_design_md_says_where_every_module_lives() -> None:
    doc = (ROOT / "docs" / "design.md").read_text()
    section = doc[doc.index("## Where the code is"):]
    section = section[:section.index("\n## ", 4)]
    blocks = re.split(r"\n\*\*[a-z-]+\*\* \(`([^`]+)`\)", section)
    assert len(blocks) >= 15, "one table per process: gateway, turn-runner, guard, judge, versions, shared, cli"
    for base, body in zip(blocks[1::2], blocks[2::2], strict=True):
        listed = set(re.findall(r"^\| `([^`]+)`", body, re.M))
        folder = ROOT / base
        files = {str(p.relative_to(folder)) for ext in ("*.py", "*.lua") for p in folder.rglob(ext)
                 if p.name not in ("__init__.py", "__main__.py")}
        assert not files - listed, f"{base}: modules docs/design.md does not place: {sorted(files - listed)}"
        stale = {x for x in listed - files if not x.endswith("/")}
        assert not stale, f"{base}: docs/design.md names modules that are not there: {sorted(stale)}"


def test_the_slowest_first_list_names_files_that_exist() -> None:
    """tests/conftest.py's SLOWEST_FIRST orders the parallel lane: a renamed file would silently
    fall back to its place in collection order."""
    from tests.conftest import SLOWEST_FIRST, TESTS

    assert [f for f in SLOWEST_FIRST if not (TESTS / f).is_file()] == []
