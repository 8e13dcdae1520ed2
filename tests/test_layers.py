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


# the fields by which one language holds the one before it
LANGUAGE_FIELDS = {"graph", "schedule", "plan", "kernel_program", "program"}


def _reach_throughs(path: Path) -> list[str]:
    """Attribute chains through two or more language fields (`w.plan.schedule`,
    `s.graph.graph`): code that digs into a language the value it holds extends,
    instead of using that value's top-level accessors.  A language's own accessor
    may reach one level down (`self.program.plan`), no further."""
    out: list[tuple[int, str]] = []
    tree = ast.parse(path.read_text(), str(path))
    # a chain is judged from its outermost language field, not again from each link inside
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in LANGUAGE_FIELDS}
    for node in ast.walk(tree):
        if id(node) in inner:
            continue
        names: list[str] = []
        e: ast.expr = node  # type: ignore[assignment]
        while isinstance(e, ast.Attribute) and e.attr in LANGUAGE_FIELDS:
            names.append(e.attr)
            e = e.value
        hops = len(names)
        own = isinstance(e, ast.Name) and e.id == "self"
        if hops > 2 or (hops == 2 and not own):
            where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
            out.append((node.lineno, f"{where}:{node.lineno}: .{'.'.join(reversed(names))}"))
    return [hit for _, hit in sorted(out)]


def test_no_code_reaches_through_nested_languages() -> None:
    """Each language offers its buffers, layout(name) and the earlier languages it
    extends at its top level (buffer_graph, schedule_graph, kernels, ...)."""
    files = [p for d in ("ir", "passes", "backends", "coil", "properties", "tests", "bench", "scripts")
             for p in sorted((ROOT / d).rglob("*.py"))]
    assert [hit for path in files for hit in _reach_throughs(path)] == []


def test_the_reach_through_check_sees_chains(tmp_path: Path) -> None:
    src = tmp_path / "x.py"
    src.write_text("bg = w.plan.schedule.graph.graph\nk = w.plan.schedule.kernels\nr = w.plan.removed\n"
                   "n = len(s.graph.graph.buffers)\nf = self.program.plan\ng = self.plan.schedule.graph\n"
                   "h = gm.graph.nodes\n")
    assert _reach_throughs(src) == ["x.py:1: .plan.schedule.graph.graph", "x.py:2: .plan.schedule",
                                    "x.py:4: .graph.graph", "x.py:6: .plan.schedule.graph"]
