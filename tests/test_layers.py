"""The layers: `ir/` (the languages, their printers, verifiers and invariants)
imports nothing above it: not the passes, the backends, the properties, the CLI or
the reports.  It may use the base modules every layer may use (errors, options)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = {"coil.errors", "coil.options"}


def _imports(path: Path) -> list[str]:
    """Every module an import statement in the file names (top level or inside a
    function alike), relative imports resolved against coil.ir."""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                out.append("coil.ir" + (f".{node.module}" if node.module else ""))
            elif node.module:
                out.append(node.module)
    return out


def upper_imports() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "ir").glob("*.py")):
        bad = [m for m in _imports(path) if m.split(".")[0] == "coil" and m != "coil"
               and not m.startswith("coil.ir") and m not in BASE]
        bad += [m for m in _imports(path) if m == "coil"]
        if bad:
            found[path.name] = bad
    return found


def test_ir_imports_no_upper_layer() -> None:
    assert upper_imports() == {}


def test_the_walk_sees_imports_inside_functions(tmp_path: Path) -> None:
    src = tmp_path / "x.py"
    src.write_text("def f():\n    from coil.passes import lower\n    import coil.backends.runtime\n"
                   "from . import expr\n")
    assert sorted(_imports(src)) == ["coil.backends.runtime", "coil.ir", "coil.passes"]
