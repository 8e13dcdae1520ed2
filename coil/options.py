"""Options: every knob of the pipeline in one frozen value.  Each field can also be
set by an environment variable COIL_<NAME> (read by `Options.from_env`)."""

from __future__ import annotations

import os
from typing import Any, Mapping

import attrs

TARGETS = ("auto", "triton", "cpp", "reference")


@attrs.frozen
class TargetTraits:
    """What a target tells the passes about itself, so that no pass branches on a
    target's name: each pass reads the trait it needs (Options.traits())."""

    # kernel names: the prefix of a pointwise, looped-reduction and persistent kernel
    prefixes: tuple[str, str, str]
    # rows up to this many elements reduce in one tile (Options.persistent_limit)
    persistent_limit: int
    # most nodes in one kernel (Options.fusion_limit)
    fusion_limit: int
    # fuse keeps a second pass over long rows out of the reduction before it, so the
    # reduction splits over many programs (Options.split_second_pass)
    splits_rows: bool
    # a reduction down the columns of what it reads loops, a block of columns a program
    # (kernel_model.reads_down_columns), instead of reducing a column a program
    column_loops: bool
    # passes/layout.py computes the tensors around 2-d convolutions channels-last
    channels_last: bool
    # realize's "reuse" rule (a pointwise node with several readers and more than one
    # nontrivial read becomes a buffer; Options.realize_reuse)
    realize_reuse: bool = True


# each target's traits: triton's limits are the GPU's (registers for 8192-wide rows,
# graph_2000's 256-step chain ran 62.6 µs on the H200 at 128 nodes a kernel against
# 71.4 at 64); the C++ target's compile time grows with a kernel's size, and mkldnn's
# convolutions run about 2x faster channels-last on one CPU thread; Triton's
# channels-last is off until measured on a GPU
TARGET_TRAITS: dict[str, TargetTraits] = {
    "triton": TargetTraits(("triton_poi", "triton_red", "triton_per"), 8192, 128, True, True, False),
    "cpp": TargetTraits(("cpp", "cpp", "cpp"), 1024, 64, False, False, True),
    "reference": TargetTraits(("ref_poi", "ref_red", "ref_per"), 1024, 64, False, False, False),
}


def _target(_inst: object, _attr: object, value: str) -> None:
    if value not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {value!r}")


@attrs.frozen
class Options:
    target: str = attrs.field(default="auto", validator=_target)
    debug_dir: str | None = None
    trace: bool = False
    verify: bool = True
    # realize (Inductor: realize_reads_threshold, realize_opcount_threshold, ...)
    realize_reads_threshold: int = 4
    realize_opcount_threshold: int = 30
    realize_acc_reads_threshold: int = 8
    # fuse: most nodes in one kernel; 0: by target (triton 128: graph_2000's 256-step
    # chain ran 62.6 µs on the H200 at 128 against 71.4 µs at 64, compiled in the
    # same time; else 64, where a C++ kernel's compile time grows with its size)
    max_fusion_size: int = 0
    fusion_rounds: int = 10
    # rows up to this many elements reduce in one tile (the whole row in registers);
    # 0: by target (triton 8192: a GPU has the registers for it; else 1024)
    persistent_reduction_threshold: int = 0
    # triton: in a kernel of at most 128 rows at least this long, a second pass over
    # the rows (x - x.mean(), layer_norm of one row, a full softmax or logsumexp) is
    # not fused with the reduction before it, so the reduction splits over many
    # programs and the pass runs as its own kernel; 0: never (one program a row).
    # H200, one row, with against without: 30 vs 151 µs (x - x.mean()) and 89 vs 245
    # µs (softmax) at 2^20 elements; 70 vs 20 µs (softmax) at 2^16, where launches
    # dominate (bench/probes/long_rows.py)
    split_second_pass: int = 1 << 18
    # lower: in a graph with 2-d convolutions, compute the tensors around them
    # channels-last (passes/layout.py); "auto": by target (cpp: on, mkldnn's
    # convolutions run about 2x faster so on one CPU thread; triton: off until
    # measured on a GPU), "on", "off"
    channels_last: str = attrs.field(default="auto", validator=attrs.validators.in_(("auto", "on", "off")))
    # realize: "reuse" makes a pointwise node with several readers and more than one
    # nontrivial read a buffer; "auto": by target (on everywhere for now).  Inductor
    # applies that rule on the CPU only (should_realize_on_cpu) and recomputes such a
    # node in every reader on a GPU: with it off, ResNet's BatchNorm backward is 2
    # kernels, not 3 (the H200 ResNet training step ran 455 kernels against
    # Inductor's 284).  Off for Triton is not measured on a GPU yet; "off" tries it
    realize_reuse: str = attrs.field(default="auto", validator=attrs.validators.in_(("auto", "on", "off")))
    # plan_memory
    reorder_for_peak_memory: bool = True
    # kernels
    # triton: round every float16/bfloat16 intermediate inside a kernel as eager does
    # (Inductor's option of the same name; off: values stay float32 between fused
    # ops, as Inductor computes them, and round only where they are stored)
    emulate_precision_casts: bool = False
    autotune: bool = False
    # triton on CUDA: compile every kernel when output_code.py loads, one thread per
    # CPU core (Triton releases the GIL while it compiles), not each at its first launch
    precompile: bool = True
    cache_dir: str | None = None
    # load a graph compiled before (same graph, inputs, options, coil and torch) from
    # cache_dir instead of compiling it again (coil/graph_cache.py)
    graph_cache: bool = True
    num_threads: int = 0
    sanitize: bool = False
    # torch.compile: a graph coil cannot compile (CoilError) runs eagerly, with a
    # warning that names the reason; off: the error reaches the caller
    eager_fallback: bool = True
    # torch.compile on CUDA: record each compiled graph into a CUDA graph and replay
    # it (mode="reduce-overhead" turns it on; backends/cudagraphs.py says when a
    # graph is not recorded, and why)
    cuda_graphs: bool = False
    # process replay (scripts/process_replay.py): every compiled module's output_code.py
    # is also written to this folder, named by its graph, inputs and options; the
    # environment's COIL_DUMP_SOURCES applies to Options built directly too
    dump_sources: str | None = None

    def traits(self) -> TargetTraits:
        """The target's traits ("auto", not yet resolved to a target: the reference's)."""
        return TARGET_TRAITS.get(self.target, TARGET_TRAITS["reference"])

    def persistent_limit(self) -> int:
        if self.persistent_reduction_threshold > 0:
            return self.persistent_reduction_threshold
        return self.traits().persistent_limit

    def prefers_channels_last(self) -> bool:
        """The target's trait for passes/layout.py, unless the option says."""
        if self.channels_last != "auto":
            return self.channels_last == "on"
        return self.traits().channels_last

    def realizes_reused(self) -> bool:
        """realize's reuse rule: the option, else the target's trait."""
        if self.realize_reuse != "auto":
            return self.realize_reuse == "on"
        return self.traits().realize_reuse

    def fusion_limit(self) -> int:
        if self.max_fusion_size > 0:
            return self.max_fusion_size
        return self.traits().fusion_limit

    def replace(self, **changes: Any) -> "Options":
        return attrs.evolve(self, **changes)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> "Options":
        """Options from a dict (torch.compile's `options=`), over the environment."""
        base = cls.from_env()
        if not values:
            return base
        names = {f.name for f in attrs.fields(cls)}
        unknown = set(values) - names
        if unknown:
            raise ValueError(f"unknown coil options {sorted(unknown)}; known: {sorted(names)}")
        return attrs.evolve(base, **dict(values))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Options":
        env = os.environ if environ is None else environ
        changes: dict[str, Any] = {}
        for f in attrs.fields(cls):
            raw = env.get(f"COIL_{f.name.upper()}")
            if raw is None:
                continue
            default = f.default
            if isinstance(default, bool):
                changes[f.name] = raw.strip().lower() in ("1", "true", "yes", "on")
            elif isinstance(default, int):
                changes[f.name] = int(raw)
            else:
                changes[f.name] = raw
        return cls(**changes)
