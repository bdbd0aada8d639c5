"""The runner's layers as a rule: every import in cox_runner points strictly downwards.

The order is data in one place, the docstring of ``cox_runner/__init__.py`` (and of each
subpackage's ``__init__``, for its own modules): numbered layers, one ``- ``name``: ...`` line per
module or subpackage. This test parses it, checks it names every module exactly once, and reads
every import of every module (anywhere in the file: inside functions and ``TYPE_CHECKING`` blocks
too) with ast. An import of the same or a higher layer fails, naming the file and the import.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "services/turn-runner/cox_runner"
TOP = "cox_runner"

_LAYER = re.compile(r"^(\d+)\. (.+)$")
_ENTRY = re.compile(r"^\s+- ``([\w]+)``: ")


def layers_of(package: Path) -> list[tuple[str, list[str]]]:
    """The layers a package's ``__init__`` docstring lists, top first: (title, entries)."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    out: list[tuple[str, list[str]]] = []
    for line in doc.splitlines():
        if m := _LAYER.match(line):
            assert int(m[1]) == len(out) + 1, f"{package.name}/__init__.py: layer {m[1]} is out of order"
            out.append((m[2], []))
        elif m := _ENTRY.match(line):
            assert out, f"{package.name}/__init__.py: ``{m[1]}`` is listed before any layer"
            out[-1][1].append(m[1])
    return out


def _packages() -> list[Path]:
    return [PKG, *sorted(p.parent for p in PKG.glob("*/__init__.py"))]


def _dotted(package: Path) -> str:
    return ".".join([TOP, *package.relative_to(PKG).parts])


def _rank() -> dict[str, tuple[int, str]]:
    """Every entry's (layer number, layer title), by its dotted name."""
    rank: dict[str, tuple[int, str]] = {}
    for package in _packages():
        for i, (title, names) in enumerate(layers_of(package), 1):
            for name in names:
                rank[f"{_dotted(package)}.{name}"] = (i, title)
    return rank


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([TOP, *parts])] = p
    return out


def _imports(name: str, path: Path, known: set[str]) -> list[tuple[int, str, str]]:
    """(line, the import as written, the module of cox_runner it reaches) for every import."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: list[tuple[int, str, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join([*base, *([node.module] if node.module else [])])
            else:
                mod = node.module or ""
            if mod != TOP and not mod.startswith(TOP + "."):
                continue
            written = f"from {'.' * node.level}{node.module or ''} import {', '.join(a.name for a in node.names)}"
            for a in node.names:
                target = f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod
                out.append((node.lineno, written, target))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == TOP or a.name.startswith(TOP + "."):
                    out.append((node.lineno, f"import {a.name}", a.name))
    return out


def _entry(module: str, package: str) -> str:
    """The entry of ``package`` that holds ``module`` (itself, or the subpackage it is in)."""
    rest = module.removeprefix(package + ".").split(".")
    return f"{package}.{rest[0]}"


def test_every_module_is_listed_once_in_its_packages_layers() -> None:
    for package in _packages():
        listed = [n for _, names in layers_of(package) for n in names]
        assert listed, f"{package.relative_to(ROOT)}/__init__.py lists no layers"
        dupes = sorted({n for n in listed if listed.count(n) > 1})
        assert not dupes, f"{package.relative_to(ROOT)}/__init__.py lists {dupes} more than once"
        present = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
        present |= {p.parent.name for p in package.glob("*/__init__.py")}
        assert set(listed) == present, (
            f"{package.relative_to(ROOT)}/__init__.py: not listed {sorted(present - set(listed))}, "
            f"listed but absent {sorted(set(listed) - present)}")


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def violations(modules: dict[str, Path], rank: dict[str, tuple[int, str]]) -> tuple[int, list[str]]:
    """(imports read, one line per import against the order) over ``modules`` (dotted name → file)."""
    known = set(modules)
    packages = sorted((m for m in known if modules[m].name == "__init__.py"), key=len)
    bad: list[str] = []
    seen = 0
    for name, path in sorted(modules.items()):
        for line, written, target in _imports(name, path, known):
            seen += 1
            if target == name:
                continue
            # The rule holds in the deepest package that holds both ends.
            common = TOP
            for pkg in packages:
                if name.startswith(pkg + ".") and (target == pkg or target.startswith(pkg + ".")):
                    common = pkg
            if target == common:
                bad.append(f"{_where(path)}:{line}: `{written}` imports its own package {common}")
                continue
            src, dst = _entry(name, common), _entry(target, common)
            if src == dst:
                continue
            (s, s_title), (d, d_title) = rank[src], rank[dst]
            if d <= s:
                where = "its own layer" if d == s else "a higher layer"
                bad.append(f"{_where(path)}:{line}: `{written}` reaches {dst} in {where} "
                           f"({d}. {d_title}) from {src} ({s}. {s_title})")
    return seen, bad


def test_every_import_points_to_a_lower_layer() -> None:
    seen, bad = violations(_modules(), _rank())
    assert seen > 100, "the test no longer reads the imports"
    assert not bad, "imports against the layer order (cox_runner/__init__.py):\n" + "\n".join(bad)


def test_the_rule_sees_imports_inside_functions_and_type_checking(tmp_path: Path) -> None:
    """The scanner itself, on a made-up ``cox_runner.budget``: an upward import in a
    ``TYPE_CHECKING`` block, a lazy one in a function and one of its own layer all fail; a
    downward one passes."""
    fake = tmp_path / "budget.py"
    fake.write_text("from typing import TYPE_CHECKING\n"
                    "from .errors import LeaseLost\n"
                    "if TYPE_CHECKING:\n    from .service import Runner\n"
                    "def f():\n    from cox_runner.drive import run_drive\n"
                    "    from . import turn\n")
    modules = {**_modules(), "cox_runner.budget": fake}
    _, bad = violations(modules, _rank())
    assert len(bad) == 3, bad
    assert all(b.startswith("budget.py:") for b in bad), bad
    assert any("from .service import Runner" in b and "a higher layer" in b for b in bad), bad
    assert any("from cox_runner.drive import run_drive" in b for b in bad), bad
    assert any("from . import turn" in b and "its own layer" in b for b in bad), bad
