"""The models suite's records as JSON (a list of records) and as markdown tables: one
table a size and compile mode, a row a model and step, the geomeans of
coil/Inductor and eager/Inductor under it for infer and train.  Both files are
rewritten after every case, so an interrupted run keeps what it measured."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from bench.hf_models import ALL_MODELS, MODES, SIZES
from bench.report import _atomic

OK = ("ok", "ref")
VARIANT_ORDER = ("eager", "inductor", "coil")
# two failed checks are alike where their RMSE ratios differ by at most this fraction
ALIKE = 1e-3
COMPILE_ORDER = ("default", "reduce-overhead")
# every record has these, None where nothing was measured
REQUIRED = ("model", "size", "mode", "compile_mode", "variant", "status", "ms", "kernels")


def record_key(rec: dict[str, Any]) -> tuple[str, str, str, str, str]:
    return rec["model"], rec["size"], rec["mode"], rec["compile_mode"], rec["variant"]


def _order(rec: dict[str, Any]) -> tuple[int, int, int, int, int]:
    def index(seq: Any, x: Any) -> int:
        seq = list(seq)
        return seq.index(x) if x in seq else len(seq)

    return (index(SIZES, rec["size"]), index(ALL_MODELS, rec["model"]), index(MODES, rec["mode"]),
            index(COMPILE_ORDER, rec["compile_mode"]), index(VARIANT_ORDER, rec["variant"]))


def geomean(xs: list[float]) -> float | None:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def fail_alike(ra: dict[str, Any], rb: dict[str, Any]) -> bool:
    """Whether both records failed the accuracy check with the same error: the same
    RMSE against float64 (within ALIKE), so the two compiled programs compute the
    same numbers and their times compare as two passing ones do.  ResNet's large
    bfloat16 inference on the GPU is such a case: Inductor and coil each 3.074x
    eager's RMSE (the check allows 3x), to the last digit."""
    xa, xb = ra.get("rmse_ratio"), rb.get("rmse_ratio")
    return (ra.get("status") == "mismatch" and rb.get("status") == "mismatch" and xa is not None
            and xb is not None and abs(float(xa) - float(xb)) <= ALIKE * max(abs(float(xa)), abs(float(xb))))


def comparable(ra: dict[str, Any], rb: dict[str, Any]) -> bool:
    """Whether two variants' times make a ratio: both passed, or both failed alike."""
    return (ra.get("status") in OK and rb.get("status") in OK) or fail_alike(ra, rb)


class Table:
    """The records of one size and compile mode, by model and step; eager's
    records (compile mode "default") serve the reduce-overhead table too."""

    def __init__(self, records: list[dict[str, Any]], size: str, compile_mode: str) -> None:
        self.size, self.compile_mode = size, compile_mode
        self.rows: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        for rec in records:
            if rec["size"] != size:
                continue
            if rec["compile_mode"] == compile_mode or (rec["variant"] == "eager" and rec["compile_mode"] == "default"):
                self.rows.setdefault((rec["model"], rec["mode"]), {})[rec["variant"]] = rec
        self.rows = {k: v for k, v in self.rows.items() if set(v) - {"eager"}}

    def ratio(self, row: dict[str, dict[str, Any]], a: str, b: str, field: str = "ms") -> float | None:
        ra, rb = row.get(a, {}), row.get(b, {})
        if comparable(ra, rb) and ra.get(field) and rb.get(field):
            return float(ra[field]) / float(rb[field])
        return None

    def round_ratios(self, row: dict[str, dict[str, Any]], a: str, b: str) -> list[float] | None:
        """a's time over b's in each timing round: the rounds are interleaved (each
        times every variant once, one after another), so each ratio pairs two times
        taken under the same load.  None unless both passed with the same rounds."""
        ra, rb = row.get(a, {}), row.get(b, {})
        xa, xb = ra.get("ms_rounds"), rb.get("ms_rounds")
        if not comparable(ra, rb) or not xa or not xb or len(xa) != len(xb):
            return None
        return [float(x) / float(y) for x, y in zip(xa, xb) if x and y] or None

    @property
    def has_wall(self) -> bool:
        """Whether any record has the back-to-back wall time (CUDA runs since it was added)."""
        return any(rec.get("wall_ms") is not None for row in self.rows.values() for rec in row.values())

    def geomeans(self) -> dict[str, dict[str, Any]]:
        """Per step: coil/inductor and eager/inductor geomeans and their counts, by
        the median time (`ms`) and, where measured, by the back-to-back wall time
        (`coil/inductor wall`)."""
        out: dict[str, dict[str, Any]] = {}
        for mode in MODES:
            for a in ("coil", "eager"):
                for field, suffix in (("ms", ""), ("wall_ms", " wall")):
                    rs = [r for (_, m), row in self.rows.items() if m == mode
                          if (r := self.ratio(row, a, "inductor", field)) is not None]
                    if rs:
                        out.setdefault(mode, {})[f"{a}/inductor{suffix}"] = {"geomean": geomean(rs), "n": len(rs)}
            paired = [statistics.median(rr) for (_, m), row in self.rows.items() if m == mode
                      if (rr := self.round_ratios(row, "coil", "inductor"))]
            if paired:
                out.setdefault(mode, {})["coil/inductor by round"] = {"geomean": geomean(paired), "n": len(paired)}
        return out


def whole_run(records: list[dict[str, Any]]) -> list[str]:
    """Summary lines over every size together, a line a compile mode and step (where
    the records hold more than one size): coil/Inductor's geomean over the rows where
    both passed, the rows missing, and each row above 1.0, the questions issue 15's
    "at most 1.0 for every model" and "geomean at most 0.9" ask of one run."""
    sizes = [s for s in SIZES if any(r["size"] == s for r in records)]
    if len(sizes) < 2:
        return []
    out = []
    for cmode in COMPILE_ORDER:
        tables = [Table(records, size, cmode) for size in sizes]
        for mode in MODES:
            ratios, above, missing, alike = [], [], [], []
            for t in tables:
                for (model, m), row in t.rows.items():
                    if m != mode:
                        continue
                    r = t.ratio(row, "coil", "inductor")
                    if r is None:
                        missing.append(f"{t.size} {model}")
                        continue
                    ratios.append(r)
                    if fail_alike(row.get("coil", {}), row.get("inductor", {})):
                        alike.append(f"{t.size} {model}")
                    if r > 1.0:
                        above.append(f"{t.size} {model} {r:.3f}")
            if not ratios:
                continue
            out.append(f"- {' and '.join(sizes)} together, {cmode}, {mode}: coil/Inductor {geomean(ratios):.2f} "
                       f"over {len(ratios)} rows, the highest {max(ratios):.2f}; "
                       + (f"above 1.0: {', '.join(above)}" if above else "none above 1.0")
                       + (f"; without a ratio (not measured, or a side failed): {', '.join(missing)}"
                          if missing else "")
                       + (f"; both compilers fail the accuracy check alike (timed, counted): {', '.join(alike)}"
                          if alike else ""))
    return out


def _ms(rec: dict[str, Any] | None, field: str = "ms") -> str:
    if not rec or rec.get(field) is None:
        return ""
    ms = float(rec[field])
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def _num(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _triple(row: dict[str, dict[str, Any]], field: str, spec: str) -> str:
    return " / ".join(_num(row.get(v, {}).get(field), spec) for v in VARIANT_ORDER)


def _by_round(ratios: list[float] | None) -> str:
    if not ratios:
        return "-"
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def _check(row: dict[str, dict[str, Any]], notes: list[str]) -> str:
    """`ok`, or each variant that did not pass with its status and a footnote (one
    footnote a message); a case the time budget left out says so once."""
    recs = [(v, row[v]) for v in VARIANT_ORDER if v in row]
    if recs and all(r.get("status") == "skipped" for _, r in recs):
        return "skipped (" + str(recs[0][1].get("error") or "") + ")"
    bad = []
    for v, rec in recs:
        if rec.get("status") in OK:
            continue
        msg = rec.get("error") or rec.get("mismatch")
        if msg:
            if msg not in notes:
                notes.append(msg)
            bad.append(f"{v} {rec['status']} [{notes.index(msg) + 1}]")
        else:
            bad.append(f"{v} {rec.get('status')}")
    verdict = ", ".join(bad) or "ok"
    if bad and fail_alike(row.get("coil", {}), row.get("inductor", {})):
        verdict += " (alike: the same RMSE, so timed)"
    few = short_rounds(row)
    return verdict + (f" ({few[0]} of {few[1]} rounds: the time budget ran out)" if few else "")


def short_rounds(row: dict[str, dict[str, Any]]) -> tuple[int, int] | None:
    """(rounds timed, rounds planned) where the time budget stopped a row's timing
    before its planned rounds (timing.timed_rounds stops at the deadline): a row
    timed in one round is one sample of a host that moves by up to 2x between
    rounds.  None where every timed variant ran every round."""
    timed = [(len(r["ms_rounds"]), r.get("rounds")) for r in row.values() if r.get("ms_rounds")]
    if not timed:
        return None
    n, planned = min(t for t, _ in timed), max((p for _, p in timed if p), default=None)
    return (n, planned) if planned and n < planned else None


def table_markdown(t: Table, cuda: bool, notes: list[str], older: frozenset[Any] | set[Any] = frozenset()) -> list[str]:
    wall = cuda and t.has_wall
    head = ["model", "step", "eager ms", "Inductor ms", "coil ms", "coil/Ind", "by round: median (range)",
            "eager/Ind"]
    if wall:
        head += ["wall ms e / I / c", "wall coil/Ind"]
    head += ["kernels e / I / c"]
    if cuda:
        head += ["GPU kernel ms e / I / c", "CUDA graphs I / c"]
    # a run with a parallel warm-up (--warm-jobs): its first calls found the caches warm
    cold = any("cold_first_call_s" in rec for row in t.rows.values() for rec in row.values())
    head += ["peak MiB e / I / c", "first call s I / c"] + (["cold first call s I / c"] if cold else []) + ["check"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "--:|" * (len(head) - 3) + "---|"]
    for (model, mode), row in t.rows.items():
        cells = [f"**{model}**", mode, _ms(row.get("eager")), _ms(row.get("inductor")), _ms(row.get("coil")),
                 _num(t.ratio(row, "coil", "inductor"), ".2f"), _by_round(t.round_ratios(row, "coil", "inductor")),
                 _num(t.ratio(row, "eager", "inductor"), ".2f")]
        if wall:
            cells += [" / ".join(_ms(row.get(v), "wall_ms") or "-" for v in VARIANT_ORDER),
                      _num(t.ratio(row, "coil", "inductor", "wall_ms"), ".2f")]
        cells += [_triple(row, "kernels", "g")]
        if cuda:
            cells += [_triple(row, "gpu_kernel_ms", ".3g"),
                      " / ".join(_num(row.get(v, {}).get("cuda_graph_launches"), "g") for v in ("inductor", "coil"))]
        cells += [_triple(row, "peak_mib", ".1f"),
                  " / ".join(_num(row.get(v, {}).get("first_call_s"), ".1f") for v in ("inductor", "coil"))]
        if cold:
            cells += [" / ".join(_num(row.get(v, {}).get("cold_first_call_s"), ".1f") for v in ("inductor", "coil"))]
        stale = any(record_key(r) in older for r in row.values())
        cells += [_check(row, notes) + (" (older coil)" if stale else "")]
        lines.append("| " + " | ".join(cells) + " |")
    width = len(head)
    for mode, g in t.geomeans().items():
        c, e = g.get("coil/inductor"), g.get("eager/inductor")
        p = g.get("coil/inductor by round")
        cells = [f"**geomean {mode}**", f"({c['n'] if c else 0})", "", "", "", _num(c and c["geomean"], ".2f"),
                 _num(p and p["geomean"], ".2f"), _num(e and e["geomean"], ".2f")]
        if wall:
            w = g.get("coil/inductor wall")
            cells += ["", _num(w and w["geomean"], ".2f")]
        cells += [""] * (width - len(cells))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


class Writer:
    """Holds this run's records (and, with `merge`, the existing file's records of
    what this run does not measure) and writes `<name>.json` and `<name>.md`."""

    def __init__(self, out: Path, name: str, run_info: dict[str, Any], notes: list[str],
                 compile_modes: tuple[str, ...], merge: bool = False) -> None:
        self.out, self.name, self.run_info, self.notes = out, name, run_info, notes
        self.compile_modes = compile_modes
        self.records: list[dict[str, Any]] = []
        self.kept: list[dict[str, Any]] = []
        out.mkdir(parents=True, exist_ok=True)
        if merge and self.json_path.exists():
            self.kept = [r for r in json.loads(self.json_path.read_text()) if isinstance(r, dict) and "model" in r]

    @property
    def json_path(self) -> Path:
        return self.out / f"{self.name}.json"

    @property
    def md_path(self) -> Path:
        return self.out / f"{self.name}.md"

    def new_record(self, **fields: Any) -> dict[str, Any]:
        rec: dict[str, Any] = {**fields, "status": "pending", "ms": None, "kernels": None, **self.run_info}
        self.records.append(rec)
        return rec

    def all_records(self) -> list[dict[str, Any]]:
        """This run's records and the kept ones it does not replace (by model,
        size, step, compile mode and variant).  A case (model, size, step) this run
        planned but measured nothing of (every record still pending, or skipped by
        the budget) keeps the existing file's records of it: a resumed run that the
        budget stops before a case loses nothing."""
        def case(r: dict[str, Any]) -> tuple[str, str, str]:
            return r["model"], r["size"], r["mode"]

        measured = {case(r) for r in self.records if r.get("status") not in ("pending", "skipped")}
        kept_cases = {case(r) for r in self.kept}
        mine = [r for r in self.records if case(r) in measured or case(r) not in kept_cases]
        keys = {record_key(r) for r in mine}
        return sorted([r for r in self.kept if record_key(r) not in keys] + mine, key=_order)

    def finish(self, elapsed_s: float, load_start: tuple[float, ...], load_end: tuple[float, ...]) -> None:
        self.run_info.update(elapsed_s=round(elapsed_s, 1), load_average_start=load_start[0],
                             load_average_end=load_end[0])
        self.write()

    def write(self) -> None:
        _atomic(self.json_path, json.dumps(self.all_records(), indent=1, default=str) + "\n")
        _atomic(self.md_path, self.markdown())

    def markdown(self) -> str:
        records = self.all_records()
        info = self.run_info
        cuda = info["device"] == "cuda"
        starts = {r.get("started") for r in records}
        last = "the last run: " if len(starts) > 1 else ""
        lines = [f"# coil benchmarks: {info['device_name']} (models suite)", "",
                 (f"torch {info['torch']}, triton {info['triton']}, transformers {info['transformers']}, "
                  f"Python {info['python']}; coil target `{info['coil_target']}`; {info['dtype']}; "
                  f"{info['rounds']} rounds"
                  + (f" ({info['rep_ms']} ms of do_bench repeats a timing"
                     + (f", at least {info['min_calls']} calls" if info.get("min_calls", 1) > 1 else "") + ")"
                     if "rep_ms" in info else "")
                  + (f"; threads {info['threads']}" if not cuda else "") + f"; {last}"
                  + (f"load average {info['load_average_start']:.1f} at the start, "
                     f"{info['load_average_end']:.1f} at the end, " if "load_average_end" in info and not cuda else "")
                  + f"{info['started']}" + (f", {info['elapsed_s']:.0f} s" if "elapsed_s" in info else "")
                  + (f" ({info['warm_up_s']:.0f} s of them the warm-up's parallel compiles)." if "warm_up_s" in info
                     and "elapsed_s" in info else ".")),
                 ""]
        notes = list(self.notes)
        latest = info.get("coil_source")
        older = {record_key(r) for r in records if latest and r.get("coil_source") != latest
                 and r.get("status") not in ("pending", "skipped")}
        if older:
            notes.append(f"rows marked `(older coil)` were measured with another version of coil's source than the last "
                         f"run's ({latest}; each record's `coil_source`, absent before 2026-12-04): "
                         f"`--resume` measures them again")
        if len(starts) > 1:
            notes.append(f"the records come from {len(starts)} runs (--merge): each record's `started` says which"
                         + (" and `load_average` how busy the machine was" if not cuda else ""))
        lines += [f"- {n}" for n in notes] + [""]
        lines += ["Times are the median over the rounds of each round's median (interleaved); ratios and "
                  "geomeans count only rows where both sides passed the check. `by round` pairs the two "
                  "compilers' times of each round (taken one after the other, under the same load): the median "
                  "of those ratios and their range, which shows how far the host's drift moves a row. Columns e / I / c: eager, Inductor, "
                  "coil. See bench/README.md for how kernels, GPU kernel time and peak memory are measured."
                  + (" On CUDA `ms` is do_bench's (L2 flushed, CUDA events around each call); `wall ms` is steps "
                     "run back to back with one sync, a training loop's steady state." if cuda else ""), ""]
        footnotes: list[str] = []
        summary: list[str] = []
        for size in SIZES:
            shape = next((r for r in records if r["size"] == size), None)
            if shape is None:
                continue
            for cmode in COMPILE_ORDER:
                t = Table(records, size, cmode)
                if not t.rows:
                    continue
                lines += [f"## {size}: hidden {shape['hidden']}, {shape['layers']} layers, batch {shape['batch']}, "
                          f"sequence {shape['seq']}; compile mode {cmode}", ""]
                lines += table_markdown(t, cuda, footnotes, older) + [""]
                for mode, g in t.geomeans().items():
                    c, w, p = g.get("coil/inductor"), g.get("coil/inductor wall"), g.get("coil/inductor by round")
                    few = sorted(m for (m, md), row in t.rows.items() if md == mode and short_rounds(row)
                                 and t.ratio(row, "coil", "inductor") is not None)
                    if c:
                        summary.append(f"- {size}, {cmode}, {mode}: coil/Inductor {c['geomean']:.2f} "
                                       f"over {c['n']} models" + (f"; by back-to-back wall time {w['geomean']:.2f} "
                                                                  f"over {w['n']}" if w else "")
                                       + (f"; by round (each row's median of its rounds' ratios) "
                                          f"{p['geomean']:.2f}" if p else "")
                                       + (f" ({', '.join(few)} timed in fewer rounds: the time budget ran out)"
                                          if few else ""))
        if summary:
            lines += ["Geomeans of coil/Inductor:", "", *summary, *whole_run(records), ""]
        if footnotes:
            lines += ["Notes:", ""] + [f"{i}. {n}" for i, n in enumerate(footnotes, 1)] + [""]
        return "\n".join(lines)
