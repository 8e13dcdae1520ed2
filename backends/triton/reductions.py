"""Reduction code for the three kernel shapes.

persistent  the whole row is one [XBLOCK, RBLOCK] tile: reduce it along axis 1
looped      accumulators of shape [XBLOCK, RBLOCK] updated per `roffset` step
            (elementwise, so every tail lane keeps its own partial result), then
            reduced along axis 1 after the loop
trivial     rnumel <= 1 inside a pointwise kernel: the value itself, or the
            identity of an empty reduction
online      a looped sum of exp(v - max v) kept relative to the rows' running
            max, rescaled when it grows (`online_row_max`, `online_sum_update`)

Every result has shape [XBLOCK, 1] (or the value's own shape when trivial) and the
dtype `result_dtype` gives.  Lanes outside the tails are replaced by the
reduction's identity before they can count (`xrmask`).

Semantics follow torch: max/min propagate NaN; argmax/argmin return the first index
of the extreme, NaN counting as the extreme; welford_m2 is the sum of squared
deviations from the mean (Welford updates when looped, merged across lanes with
Chan's formula).  Only tl.sum / tl.max / tl.min reduce across lanes, which are fast
in the interpreter too; prod alone needs a combine function.
"""

from __future__ import annotations

import torch

from coil.backends.triton.handler import Emitter, convert, literal, tl_dtype
from coil.errors import CoilError
from coil.passes.schedule.split import partial_dtypes, result_dtype, work_dtype


def _extreme(dt: torch.dtype, lowest: bool) -> str:
    """The identity of max (lowest) or min (highest) in dtype dt."""
    if dt.is_floating_point:
        return literal(float("-inf") if lowest else float("inf"))
    info = torch.iinfo(dt)
    return literal(info.min if lowest else info.max)


def _is_max(rt: str) -> bool:
    return rt in ("max", "argmax")


def _nan_aware_extreme(out: Emitter, rt: str, tile: str, dt: torch.dtype) -> str:
    """tl.max / tl.min of a tile along axis 1, NaN when the row has one (float32
    and float64 tiles: helpers that are one max.NaN / min.NaN reduction on a GPU)."""
    fn = "max" if _is_max(rt) else "min"
    if dt in (torch.float32, torch.float64):
        return out.assign(f"_coil_row_{fn}_nan({tile})[:, None]")
    m = out.assign(f"tl.{fn}({tile}, 1)[:, None]")
    if not dt.is_floating_point:
        return m
    # half-precision tiles keep the two reductions (the one-reduction form is not yet run on a GPU for them)
    has_nan = f"tl.max(({tile} != {tile}).to(tl.int8), 1)[:, None] > 0"
    return out.assign(f"tl.where({has_nan}, float(\"nan\"), {m})")


def _first_index(out: Emitter, tile: str, m: str, positions: str, valid: str, dt: torch.dtype) -> str:
    """Smallest position holding the row's extreme `m` (NaN matches NaN)."""
    hit = f"({tile} == {m})" + (f" | (({tile} != {tile}) & ({m} != {m}))" if dt.is_floating_point else "")
    best = out.assign(f"{valid} & ({hit})")
    return out.assign(f"tl.min(tl.where({best}, {positions}, rnumel), 1)[:, None].to(tl.int64)")


# ---- persistent ------------------------------------------------------------------------------


def persistent(out: Emitter, rt: str, v: str, dt: torch.dtype, sums: dict[str, str] | None = None) -> str:
    """Reduce the value tile `v` (dtype dt) of a whole row.  `sums`: the row sums
    the kernel has made so far, by value tile, so that a var_mean's sum and its
    welford_m2 (whose mean is that sum over rnumel) reduce the row once."""
    sums = {} if sums is None else sums
    match rt:
        case "sum":
            if v not in sums:
                sums[v] = out.assign(f"tl.sum(tl.where(xrmask, {v}, 0), 1)[:, None]")
            return sums[v]
        case "prod":
            return out.assign(f"tl.reduce(tl.where(xrmask, {v}, 1), 1, _coil_prod_combine)[:, None]")
        case "max" | "min" | "argmax" | "argmin":
            wd = work_dtype(dt)
            w = v if wd == dt else out.assign(convert(v, dt, wd))
            tile = out.assign(f"tl.where(xrmask, {w}, {_extreme(wd, _is_max(rt))})")
            m = _nan_aware_extreme(out, rt, tile, wd)
            if rt.startswith("arg"):
                return _first_index(out, tile, m, "rindex", "xrmask", wd)
            return m if wd == dt else out.assign(convert(m, wd, dt))
        case "any":
            return out.assign(f"tl.max((xrmask & {v}).to(tl.int8), 1)[:, None] > 0")
        case "all":
            return out.assign(f"tl.min(((xrmask == 0) | {v}).to(tl.int8), 1)[:, None] > 0")
        case "welford_m2":
            mean = out.assign(f"{persistent(out, 'sum', v, dt, sums)} / rnumel")
            dev = out.assign(f"tl.where(xrmask, {v} - {mean}, 0)")
            return out.assign(f"tl.sum({dev} * {dev}, 1)[:, None]")
    raise CoilError(f"triton target: no reduction {rt}")


# ---- looped ----------------------------------------------------------------------------------


def _tile(value: bool | int | float, dt: torch.dtype) -> str:
    return f"tl.full([XBLOCK, RBLOCK], {literal(value)}, {tl_dtype(dt)})"


def looped_init(out: Emitter, rt: str, dt: torch.dtype, index_dt: torch.dtype) -> tuple[str, ...]:
    """Accumulators, emitted before the loop."""
    wd = work_dtype(dt)

    def acc(init: str) -> str:
        return out.assign(init, "_acc")

    match rt:
        case "sum":
            return (acc(_tile(0, dt)),)
        case "prod":
            return (acc(_tile(1, dt)),)
        case "max" | "min":
            return (acc(f"tl.full([XBLOCK, RBLOCK], {_extreme(wd, rt == 'max')}, {tl_dtype(wd)})"),)
        case "argmax" | "argmin":
            value = acc(f"tl.full([XBLOCK, RBLOCK], {_extreme(wd, rt == 'argmax')}, {tl_dtype(wd)})")
            return value, acc(_tile(-1, index_dt))  # -1: the lane has seen nothing yet
        case "any":
            return (acc(_tile(0, torch.int8)),)
        case "all":
            return (acc(_tile(1, torch.int8)),)
        case "welford_m2":
            return acc(_tile(0.0, dt)), acc(_tile(0.0, dt)), acc(_tile(0.0, dt))
    raise CoilError(f"triton target: no reduction {rt}")


def looped_update(out: Emitter, rt: str, accs: tuple[str, ...], v: str, dt: torch.dtype) -> None:
    """Fold this step's value tile into the accumulators (inside the loop).
    Loop-carried values keep their dtype and [XBLOCK, RBLOCK] shape."""
    wd = work_dtype(dt)
    match rt:
        case "sum":
            out.emit(f"{accs[0]} = {accs[0]} + tl.where(xrmask, {v}, 0)")
        case "prod":
            out.emit(f"{accs[0]} = {accs[0]} * tl.where(xrmask, {v}, 1)")
        case "max" | "min" if wd.is_floating_point:
            # one max.NaN / min.NaN per element: NaN sticks to the lane
            fn = "maximum" if rt == "max" else "minimum"
            w = v if wd == dt else out.assign(convert(v, dt, wd))
            out.emit(f"{accs[0]} = tl.where(xrmask, tl.{fn}({accs[0]}, {w}, propagate_nan=tl.PropagateNan.ALL), {accs[0]})")
        case "max" | "min" | "argmax" | "argmin":
            w = v if wd == dt else out.assign(convert(v, dt, wd))
            a = accs[0]
            cmp = ">" if _is_max(rt) else "<"
            # strictly better, or the first NaN: ties keep the earlier (smaller) index;
            # an arg lane takes its first element whatever it is (it may be -inf)
            nan = f" | (({w} != {w}) & ({a} == {a}))" if wd.is_floating_point else ""
            first = f" | ({accs[1]} < 0)" if rt.startswith("arg") else ""
            take = out.assign(f"xrmask & (({w} {cmp} {a}){nan}{first})")
            out.emit(f"{a} = tl.where({take}, {w}, {a})")
            if rt.startswith("arg"):
                out.emit(f"{accs[1]} = tl.where({take}, rindex, {accs[1]})")
        case "any":
            out.emit(f"{accs[0]} = tl.maximum({accs[0]}, (xrmask & {v}).to(tl.int8))")
        case "all":
            out.emit(f"{accs[0]} = tl.minimum({accs[0]}, ((xrmask == 0) | {v}).to(tl.int8))")
        case "welford_m2":
            mean, m2, weight = accs
            n1 = out.assign(f"{weight} + 1.0")
            delta = out.assign(f"{v} - {mean}")
            new_mean = out.assign(f"{mean} + {delta} / {n1}")
            out.emit(f"{m2} = tl.where(xrmask, {m2} + {delta} * ({v} - {new_mean}), {m2})")
            out.emit(f"{mean} = tl.where(xrmask, {new_mean}, {mean})")
            out.emit(f"{weight} = tl.where(xrmask, {n1}, {weight})")
        case _:
            raise CoilError(f"triton target: no reduction {rt}")


def looped_final(out: Emitter, rt: str, accs: tuple[str, ...], dt: torch.dtype) -> str:
    """Reduce the accumulators across lanes (after the loop)."""
    wd = work_dtype(dt)
    match rt:
        case "sum":
            return out.assign(f"tl.sum({accs[0]}, 1)[:, None]")
        case "prod":
            return out.assign(f"tl.reduce({accs[0]}, 1, _coil_prod_combine)[:, None]")
        case "max" | "min":
            m = _nan_aware_extreme(out, rt, accs[0], wd)
            return m if wd == dt else out.assign(convert(m, wd, dt))
        case "argmax" | "argmin":
            m = _nan_aware_extreme(out, rt, accs[0], wd)
            return _first_index(out, accs[0], m, accs[1], f"xmask & ({accs[1]} >= 0)", wd)
        case "any":
            return out.assign(f"tl.max({accs[0]}, 1)[:, None] > 0")
        case "all":
            return out.assign(f"tl.min({accs[0]}, 1)[:, None] > 0")
        case "welford_m2":
            mean, m2, weight = accs
            total = out.assign(f"tl.sum({weight}, 1)[:, None]")
            mu = out.assign(f"tl.sum({mean} * {weight}, 1)[:, None] / {total}")
            dm = out.assign(f"{mean} - {mu}")
            return out.assign(f"tl.sum({m2} + tl.where({weight} > 0, {dm} * {dm} * {weight}, 0), 1)[:, None]")
    raise CoilError(f"triton target: no reduction {rt}")


# ---- split: partial results of several programs --------------------------------------------------


def split_partials(out: Emitter, rt: str, accs: tuple[str, ...], dt: torch.dtype) -> list[str]:
    """After one program's loop: what it stores for the combine, one value per
    workspace.  Most reductions store their result; Welford stores the mean, M2 and
    count of its elements (0 for the mean of none), argmax/argmin the extreme and
    its first index."""
    wd = work_dtype(dt)
    match rt:
        case "welford_m2":
            mean, m2, weight = accs
            total = out.assign(f"tl.sum({weight}, 1)[:, None]")
            mu = out.assign(f"tl.where({total} > 0, tl.sum({mean} * {weight}, 1)[:, None] / {total}, 0.0)")
            dm = out.assign(f"{mean} - {mu}")
            spread = out.assign(f"tl.sum({m2} + tl.where({weight} > 0, {dm} * {dm} * {weight}, 0), 1)[:, None]")
            return [mu, spread, total]
        case "argmax" | "argmin":
            m = _nan_aware_extreme(out, rt, accs[0], wd)
            return [m, _first_index(out, accs[0], m, accs[1], f"xmask & ({accs[1]} >= 0)", wd)]
    return [looped_final(out, rt, accs, dt)]


def split_identities(rt: str, dt: torch.dtype) -> list[str]:
    """What a lane past the last partial holds, per workspace (split_partials' order)."""
    match rt:
        case "sum" | "welford_m2":
            return [literal(0)] * len(partial_dtypes(rt, dt))
        case "prod":
            return [literal(1)]
        case "max" | "min":
            return [_extreme(dt, rt == "max")]
        case "argmax" | "argmin":
            return [_extreme(work_dtype(dt), rt == "argmax"), literal(0)]
        case "any":
            return [literal(False)]
        case "all":
            return [literal(True)]
    raise CoilError(f"triton target: no split reduction {rt}")


def split_combine(out: Emitter, rt: str, tiles: list[str], dt: torch.dtype) -> str:
    """Reduce [XBLOCK, RBLOCK] tiles of partial results (one lane per program of the
    first stage; the identity past the last, `pmask`) to the row's result."""
    match rt:
        case "sum" | "prod" | "max" | "min" | "welford_m2":
            return looped_final(out, rt, tuple(tiles), dt)  # Chan's merge, as across lanes
        case "argmax" | "argmin":
            wd = work_dtype(dt)
            m = _nan_aware_extreme(out, rt, tiles[0], wd)
            return _first_index(out, tiles[0], m, tiles[1], "pmask", wd)
        case "any":
            return out.assign(f"tl.max({tiles[0]}.to(tl.int8), 1)[:, None] > 0")
        case "all":
            return out.assign(f"tl.min({tiles[0]}.to(tl.int8), 1)[:, None] > 0")
    raise CoilError(f"triton target: no split reduction {rt}")


# ---- online softmax: a sum of exp(v - max) in the max's loop ------------------------------------


def online_row_max(out: Emitter, row_max: str, v: str) -> tuple[str, str, str]:
    """The rows' max so far including this step's tile v (NaN once a row has
    seen one: it is also the max node's value), the same with -inf read as 0 (so
    a row that has seen only -inf subtracts a finite number: exp(-inf - -inf)
    would be NaN), and the factor that moves sums relative to the previous max
    onto the new one.  One cross-lane max per step; each element then costs a
    single exp."""
    step = out.assign(f'_coil_row_max_nan(tl.where(xrmask, {v}, float("-inf")))[:, None]')
    new = out.assign(f"tl.maximum({row_max}, {step}, propagate_nan=tl.PropagateNan.ALL)")
    safe = out.assign(f'tl.where({new} == float("-inf"), 0.0, {new})')
    scale = out.assign(f"tl.exp({row_max} - {safe})")
    return new, safe, scale


def online_sum_update(out: Emitter, acc: str, safe_max: str, scale: str, v: str) -> None:
    """acc holds, per lane, the sum of exp(v - the row's max so far): rescale it to
    the new max and add this step's terms.  NaN reaches the sum through the max;
    +inf through exp(inf - inf); a row of only -inf sums to 0 (exp(-inf - 0))."""
    e = out.assign(f"tl.where(xrmask, tl.exp({v} - {safe_max}), 0.0)")
    out.emit(f"{acc} = {acc} * {scale} + {e}")


# ---- trivial ---------------------------------------------------------------------------------

_EMPTY: dict[str, bool | int | float] = {"sum": 0, "prod": 1, "any": False, "all": True, "welford_m2": float("nan")}


def trivial(out: Emitter, rt: str, v: str | None, dt: torch.dtype) -> str:
    """A reduction over one element (`v`) or none (`v` is None)."""
    res = result_dtype(rt, dt)
    if v is None:
        if rt not in _EMPTY:
            raise CoilError(f"triton target: {rt} of an empty dimension")
        return out.assign(f"tl.full([1], {literal(_EMPTY[rt])}, {tl_dtype(res)})")
    match rt:
        case "sum" | "prod" | "max" | "min" | "any" | "all":
            return v
        case "argmax" | "argmin":
            return out.assign("tl.full([1], 0, tl.int64)")
        case "welford_m2":
            return out.assign(f"({v} - {v}) * ({v} - {v})")  # 0, or nan for inf and nan
    raise CoilError(f"triton target: no reduction {rt}")
