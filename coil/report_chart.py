"""The buffer-lifetime chart: buffers against steps, with live bytes and the peak.

Top: one horizontal bar per buffer (graph inputs included) from the step before
which it is allocated to the step after which it is freed; outputs run on to
`return`.  Colour says what the buffer is, thickness how many bytes it holds; a
dashed arrow joins a freed buffer to the one that reuses its storage.
Bottom: bytes live while each step runs, the peak marked.  The x axis is the
chosen execution order: `call(args)`, one column per step (kernel names,
shortened), `return`.

matplotlib is imported here only, so `import coil` stays fast; the figure draws on
its own Agg canvas, so nothing needs a display and pyplot's backend is untouched.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MultipleLocator

from coil.ir.memory import MemoryPlan
from coil.report import Lifetime, fmt_bytes, natural_key, peak_step, short_step_label, step_label

COLORS = {"input": "#4C72B0", "buffer": "#DD8452", "output": "#55A868", "view": "#B0B0B0"}
LEGEND = {"input": "graph input", "buffer": "intermediate buffer", "output": "output (returned)",
          "view": "view (no storage)"}
PEAK = "#C44E52"


def _bar_height(nbytes: int, largest: int) -> float:
    """Thickness grows with the square root of bytes, so small buffers stay visible."""
    if largest <= 0:
        return 0.3
    return 0.22 + 0.6 * math.sqrt(nbytes / largest)


def _byte_formatter(value: float, _pos: int) -> str:
    return fmt_bytes(int(value)) if value >= 0 else ""


def _byte_tick(top: int) -> int:
    """A tick step that is a power of two bytes, giving three to six ticks."""
    return 1 << max(int(math.log2(top / 3)), 0) if top >= 3 else 1


# inches: per buffer row, for the live-bytes panel, and for title and step labels
ROW, LIVE_PANEL, MARGINS = 0.4, 2.2, 3.0


def _layout(n_steps: int, n_buffers: int) -> tuple[tuple[float, float], list[float]]:
    """Figure size and the two panels' height ratios, in inches, so the live-bytes
    panel keeps its height however many buffers there are.  Capped so a graph of
    thousands of buffers still fits Agg's canvas."""
    bars = min(max(n_buffers, 5) * ROW, 100.0)
    width = min(max(10.0, 1.2 * n_steps + 5.0), 60.0)
    return (width, bars + LIVE_PANEL + MARGINS), [bars, LIVE_PANEL]


def _draw_bars(ax: Any, plan: MemoryPlan, lives: Sequence[Lifetime]) -> None:
    end_x = len(plan.steps)  # the `return` column
    largest = max((lt.nbytes for lt in lives), default=0)
    rows = {lt.name: y for y, lt in enumerate(lives)}
    for y, lt in enumerate(lives):
        start = lt.born - 0.4
        stop = (end_x if lt.freed is None else lt.freed) + 0.4
        ax.barh(y, stop - start, left=start, height=_bar_height(lt.nbytes, largest),
                color=COLORS[lt.kind], edgecolor="black", linewidth=0.6, zorder=3,
                hatch="//" if lt.kind == "view" else None)
        note = fmt_bytes(lt.nbytes) if lt.kind != "view" else "view"
        if lt.reuses:
            note += f", reuses {lt.reuses}"
        ax.text(stop + 0.08, y, note, va="center", ha="left", fontsize=8, color="#333333", zorder=4)
    for lt in lives:
        if lt.reuses and lt.reuses in rows:
            old = next(o for o in lives if o.name == lt.reuses)
            ax.annotate("", xy=(lt.born - 0.4, rows[lt.name]), xytext=((old.freed or 0) + 0.4, rows[old.name]),
                        arrowprops={"arrowstyle": "->", "linestyle": "--", "color": "#555555", "lw": 1.0},
                        zorder=5)
    ax.set_yticks(range(len(lives)))
    ax.set_yticklabels([f"{lt.name}  {lt.layout}" for lt in lives], fontsize=9, family="monospace")
    ax.set_ylim(len(lives) - 0.4, -0.6)  # first-born at the top
    ax.set_ylabel("buffer")
    ax.grid(axis="x", color="#E5E5E5", zorder=0)


def _draw_live(ax: Any, plan: MemoryPlan, lives: Sequence[Lifetime]) -> None:
    """Bytes live at `call(args)` (the inputs), during each step, and at `return`
    (what the caller is handed)."""
    n = len(plan.steps)
    inputs = sum(lt.nbytes for lt in lives if lt.kind == "input")
    returned = sum(lt.nbytes for lt in lives if lt.freed is None)  # outputs, and inputs they alias
    xs = [-1, *range(n), n]
    live = [inputs, *(ps.live_bytes for ps in plan.steps), returned]
    ax.step(xs, live, where="mid", color="#333333", linewidth=1.5, zorder=3)
    ax.plot(xs, live, "o", color="#333333", markersize=4, zorder=4)
    ax.fill_between(xs, live, step="mid", color="#999999", alpha=0.25, zorder=2)
    top = max(max(live), 1)
    ax.yaxis.set_major_locator(MultipleLocator(_byte_tick(top)))
    ax.yaxis.set_major_formatter(_byte_formatter)
    ax.set_ylabel("live bytes")
    ax.set_ylim(0, top * 1.55)  # headroom for the peak's label
    ax.grid(axis="both", color="#E5E5E5", zorder=0)
    at = peak_step(plan)
    if at is None:
        return
    peak = plan.steps[at].live_bytes
    ax.plot([at], [peak], "*", color=PEAK, markersize=16, zorder=5)
    label = f"peak {fmt_bytes(peak)} ({peak:,} B)\nat step {at}: {step_label(plan, plan.steps[at].step)}"
    ax.annotate(label, xy=(at, peak), xytext=(12, 8), textcoords="offset points", ha="left", va="bottom",
                fontsize=9, color=PEAK, fontweight="bold", zorder=6,
                bbox={"boxstyle": "round,pad=0.25", "facecolor": "white", "edgecolor": PEAK, "alpha": 0.9})


def _mark_peak_column(axes: Sequence[Any], plan: MemoryPlan) -> None:
    at = peak_step(plan)
    if at is not None:
        for ax in axes:
            ax.axvspan(at - 0.5, at + 0.5, color=PEAK, alpha=0.08, zorder=1)


def _x_labels(plan: MemoryPlan) -> list[str]:
    steps = [f"{i}: {short_step_label(plan, ps.step)}" for i, ps in enumerate(plan.steps)]
    return ["call(args)"] + steps + ["return"]


def _name_list(xs: Sequence[str], limit: int = 16) -> str:
    if not xs:
        return "none"
    more = f" (+{len(xs) - limit} more)" if len(xs) > limit else ""
    return ", ".join(xs[:limit]) + more


def _title(plan: MemoryPlan, title: str | None) -> str:
    head = title or "coil buffer lifetimes"
    target = plan.schedule.kernels[0].name.split("_")[0] if plan.schedule.kernels else None
    removed = _name_list(sorted(plan.removed, key=natural_key))
    facts = f"order {plan.strategy}, peak {fmt_bytes(plan.peak_bytes)}" + (f", kernels {target}_*" if target else "")
    return f"{head}  ({facts})\nkernel-internal, kept in registers, never allocated: {removed}"


def _legend(ax: Any, lives: Sequence[Lifetime]) -> None:
    kinds = [k for k in LEGEND if any(lt.kind == k for lt in lives)]
    handles = [Patch(facecolor=COLORS[k], edgecolor="black", label=LEGEND[k]) for k in kinds]
    if not handles:  # a graph without buffers (one that only returns): nothing to name
        return
    # above the plot, so it never hides a bar
    ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=len(handles), fontsize=8,
              frameon=False)


def draw_lifetimes(plan: MemoryPlan, lives: Sequence[Lifetime], path: str, title: str | None) -> None:
    n = len(plan.steps)
    size, ratios = _layout(n, len(lives))
    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)  # the Agg canvas, set on this figure only: pyplot's global backend is left alone
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": ratios})
    _draw_bars(top, plan, lives)
    _draw_live(bottom, plan, lives)
    _mark_peak_column((top, bottom), plan)
    _legend(top, lives)
    bottom.set_xticks(range(-1, n + 1))
    bottom.set_xticklabels(_x_labels(plan), rotation=30, ha="right", rotation_mode="anchor", fontsize=9,
                           family="monospace")
    bottom.set_xlim(-1.6, n + 1.6)  # room for the byte notes right of `return`
    bottom.set_xlabel("step (execution order)")
    # title and legend get a fixed band of inches at the top, whatever the figure's height
    height = size[1]
    fig.suptitle(_title(plan, title), fontsize=11, x=0.01, y=1 - 0.12 / height, ha="left", va="top")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / height))
    fig.savefig(path, dpi=110)
