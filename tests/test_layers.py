"""The layers: `ir/` (the languages, their printers, verifiers and invariants)
imports nothing above it: not the passes, the backends, the properties, the CLI or
the reports.  It may use the base modules every layer may use (errors, options).
`passes/` imports no backend, report, CLI or property: what it needs of them comes
as arguments (the target's traits, the backends' kernel_gen, observers)."""

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


# what passes/ may not import: the layers above it, and the modules of coil/ that
# only the public face uses (the reports, the graph cache, the CLI)
ABOVE_PASSES = ("coil.backends", "coil.properties", "coil.cli", "coil.report", "coil.report_chart",
                "coil.graph_cache", "coil.__main__")


def pass_imports_above() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "passes").rglob("*.py")):
        bad = [m for m in _imports(path) if m == "coil" or any(m == a or m.startswith(a + ".") for a in ABOVE_PASSES)]
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    return found


def test_passes_import_no_backend_report_or_cli() -> None:
    assert pass_imports_above() == {}


def test_the_walk_sees_imports_inside_functions(tmp_path: Path) -> None:
    src = tmp_path / "x.py"
    src.write_text("def f():\n    from coil.passes import lower\n    import coil.backends.runtime\n"
                   "from . import expr\n")
    assert sorted(_imports(src)) == ["coil.backends.runtime", "coil.ir", "coil.passes"]


TARGET_NAMES = {"triton", "cpp", "reference"}


def _target_branches(path: Path) -> list[str]:
    """Comparisons with a target's name (`options.target == "triton"`,
    `target in ("cpp", ...)`), and lookups of a table by a target's name in a
    subscript (`PREFIX["cpp"]`): the places a module decides by which target it is."""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        consts: list[ast.expr] = []
        if isinstance(node, ast.Compare):
            for e in (node.left, *node.comparators):
                consts += e.elts if isinstance(e, (ast.Tuple, ast.List, ast.Set)) else [e]
        elif isinstance(node, ast.Subscript):
            consts.append(node.slice)
        if any(isinstance(c, ast.Constant) and c.value in TARGET_NAMES for c in consts):
            out.append(f"{path.name}:{node.lineno}")
    return out


def test_no_pass_branches_on_the_targets_name() -> None:
    """Target knowledge comes to the passes as the target's traits
    (Options.traits(), coil.options.TargetTraits), never as its name."""
    found = [hit for path in sorted((ROOT / "passes").rglob("*.py")) for hit in _target_branches(path)]
    assert found == []


def test_the_target_branch_check_sees_comparisons_and_lookups(tmp_path: Path) -> None:
    src = tmp_path / "x.py"
    src.write_text('if o.target == "triton":\n    pass\nok = o.target in ("cpp", "reference")\n'
                   'p = PREFIX["cpp"]\nfine = o.target != "auto"\n')
    assert _target_branches(src) == ["x.py:1", "x.py:3", "x.py:4"]
