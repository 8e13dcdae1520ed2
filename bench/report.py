"""The results as a markdown table and a JSON file, rewritten after each step so an
interrupted run still leaves what it measured."""

from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path
from typing import Any

OK = ("ok", "ref")


def _fmt_time(s: float | None) -> str:
    if s is None:
        return ""
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    return f"{s:.3g} s"


def _fmt(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


def _mib(b: int | None) -> str:
    return "n/a" if b is None else f"{b / 2**20:.1f}"


def time_ratios(wl: dict[str, Any]) -> dict[str, float]:
    """coil/inductor, eager/inductor and coil/eager time ratios where both sides ran
    and matched eager."""
    v = wl["variants"]

    def t(name: str) -> float | None:
        rec = v.get(name, {})
        return rec.get("time_s") if rec.get("status") in OK else None

    out = {}
    for a, b in (("coil", "inductor"), ("eager", "inductor"), ("coil", "eager")):
        ta, tb = t(a), t(b)
        if ta and tb:
            out[f"{a}/{b}"] = ta / tb
    return out


def round_ratios(wl: dict[str, Any]) -> list[float]:
    """coil/Inductor in each timing round (the rounds interleave the variants, so a
    round's two times were taken minutes apart at most); empty unless both passed
    and ran the same number of rounds, more than one."""
    v = wl["variants"]
    a, b = v.get("coil", {}), v.get("inductor", {})
    ta, tb = a.get("time_rounds_s") or [], b.get("time_rounds_s") or []
    if a.get("status") not in OK or b.get("status") not in OK or len(ta) != len(tb) or len(ta) < 2:
        return []
    return [x / y for x, y in zip(ta, tb)]


def _round_lines(results: dict[str, Any]) -> list[str]:
    spread = []
    for wl in results["workloads"]:
        median, rounds = time_ratios(wl).get("coil/inductor"), round_ratios(wl)
        if median is not None and rounds:
            spread.append((wl["name"], median, rounds))
    if not spread:
        return []
    n = len(spread[0][2])
    return ["", f"coil/Inductor to three places, the median of {n} rounds, and the lowest and highest single round:",
            ""] + [f"- {name}: {r:.3f} ({min(rs):.3f} to {max(rs):.3f})" for name, r, rs in spread]


def geomeans(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    per: dict[str, list[float]] = {}
    for wl in results["workloads"]:
        for key, r in time_ratios(wl).items():
            per.setdefault(key, []).append(r)
    return {k: {"geomean": math.exp(sum(map(math.log, rs)) / len(rs)), "n": len(rs)} for k, rs in per.items()}


def _check_cell(rec: dict[str, Any], notes: list[str]) -> str:
    status = str(rec.get("status", "pending"))
    msg = rec.get("error") or rec.get("mismatch")
    if msg:
        notes.append(msg)
        return f"{status} [{len(notes)}]"
    return status


def _row(name: str, variant: str, rec: dict[str, Any], wl: dict[str, Any], notes: list[str]) -> str:
    ratio = time_ratios(wl).get(f"{variant}/inductor") if variant != "inductor" else None
    if variant == "inductor" and rec.get("status") in OK and rec.get("time_s"):
        ratio = 1.0
    compile_note = rec.get("compile_error")
    cold = _fmt(rec.get("cold_compile_s"), ".2f")
    if compile_note:
        notes.append(f"{variant} compile timing: {compile_note}")
        cold = f"{cold} [{len(notes)}]".strip()
    cells = [
        name, variant, _check_cell(rec, notes), _fmt_time(rec.get("time_s")),
        _fmt(rec.get("gb_per_s"), ".1f"), _fmt(100 * rec["copy_fraction"] if rec.get("copy_fraction") else None, ".0f"),
        _fmt(rec.get("launches"), "g"), _mib(rec.get("peak_bytes")) if "peak_bytes" in rec else "",
        _mib(rec.get("plan_peak_bytes")) if rec.get("plan_peak_bytes") is not None else "",
        cold, _fmt(rec.get("warm_compile_s"), ".2f"), _fmt(ratio, ".2f"),
    ]
    return "| " + " | ".join(cells) + " |"


HEADER = ("| workload | variant | check | time | GB/s | % copy | launches | peak MiB | plan MiB | cold s | warm s "
          "| ×Inductor |\n|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")


def _head(results: dict[str, Any]) -> list[str]:
    copy = results.get("copy_bytes_per_s")
    rate = f"copy rate {copy / 1e9:.1f} GB/s" if copy else "copy rate not measured"
    if results.get("device") == "cpu" and results.get("threads"):
        rate += f"; threads {results['threads']}"
    load = results.get("load_average_start")
    if results.get("device") == "cpu" and load:
        end = results.get("load_average_end")
        rate += f"; load average {load[0]:.1f}" + (f" at the start, {end[0]:.1f} at the end" if end else "")
    lines = [
        f"# coil benchmarks: {results['device_name']} ({results['suite']} suite)",
        "",
        (f"torch {results['torch']}, triton {results['triton']}, Python {results['python']}; "
         f"coil target `{results['coil_target']}`; {rate}; {results['started']}, "
         f"{results.get('elapsed_s', 0):.0f} s."),
        "",
    ]
    if results.get("notes"):
        lines += [f"- {n}" for n in results["notes"]] + [""]
    return lines


def _geomean_rows(results: dict[str, Any]) -> list[str]:
    rows = []
    for key, g in geomeans(results).items():
        if key.endswith("/inductor"):
            variant = key.split("/")[0]
            rows.append(f"| **geomean** ({g['n']}) | {variant} |" + " |" * 9 + f" {g['geomean']:.2f} |")
    return rows


def markdown(results: dict[str, Any]) -> str:
    notes: list[str] = []
    rows = []
    for wl in results["workloads"]:
        for i, (variant, rec) in enumerate(wl["variants"].items()):
            rows.append(_row(f"**{wl['name']}**" if i == 0 else "", variant, rec, wl, notes))
    lines = [*_head(results), HEADER, *rows, *_geomean_rows(results), "", "Workloads:", ""]
    lines += [f"- **{wl['name']}**: {wl['description']}; fewest bytes {_mib(wl.get('min_bytes'))} MiB"
              for wl in results["workloads"]]
    g = geomeans(results).get("coil/eager")
    if g:
        lines += ["", f"coil/eager time, geomean over {g['n']}: {g['geomean']:.2f}"]
    lines += _round_lines(results)
    if notes:
        lines += ["", "Notes:", ""] + [f"{i}. {n}" for i, n in enumerate(notes, 1)]
    return "\n".join(lines) + "\n"


class Writer:
    """Writes `<name>.json` and `<name>.md` under `out`; thread-safe."""

    def __init__(self, out: Path, name: str, results: dict[str, Any]) -> None:
        self.out, self.name, self.results = out, name, results
        self.lock = threading.RLock()
        out.mkdir(parents=True, exist_ok=True)

    @property
    def json_path(self) -> Path:
        return self.out / f"{self.name}.json"

    @property
    def md_path(self) -> Path:
        return self.out / f"{self.name}.md"

    def write(self) -> None:
        with self.lock:
            self.results["geomean"] = geomeans(self.results)
            for wl in self.results["workloads"]:
                wl["ratios"] = time_ratios(wl)
                wl["coil_inductor_rounds"] = round_ratios(wl)
            _atomic(self.json_path, json.dumps(self.results, indent=1, default=str) + "\n")
            _atomic(self.md_path, markdown(self.results))


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
