"""Options: every knob of the pipeline in one frozen value.  Each field can also be
set by an environment variable COIL_<NAME> (read by `Options.from_env`)."""

from __future__ import annotations

import os
from typing import Any, Mapping

import attrs

TARGETS = ("auto", "triton", "cpp", "reference")


@attrs.frozen
class SplitTraits:
    """When and how a reduction of few long rows, or down long columns, spreads
    over many programs and then combines their partial results
    (passes/schedule/split.py)."""

    row_min: int  # rows at least this long split (below, one program a row is quick enough)
    max_rows: int  # in kernels of at most this many rows (more already give every SM programs)
    programs: int  # programs of the first stage, all rows together, about
    min_chunk: int  # elements each reduces, at least
    max_parts: int  # programs a row, at most
    max_rblock: int  # a program's step along its chunk, at most
    column_min: int  # columns at least this many rows long split
    column_xblock: int  # in blocks of this many columns
    column_rblock: int  # rows a step (for a full block of columns)
    min_column_chunk: int  # rows a program, at least
    max_column_parts: int  # programs a block of columns, at most (the combine holds them all)


@attrs.frozen
class TileTraits:
    """2-D tiles for pointwise kernels that read some input along the other axis
    (passes/schedule/tiling.py)."""

    min_side: int  # narrower rows or columns are not worth a 2-D tile
    max_grid_y: int  # the programs grid axis 1 may have (row blocks, at least one row each)


@attrs.frozen
class ColumnTraits:
    """What a target asks of kernel_model.down_columns, the one rule (Triton's and the
    C++ target's) of a reduction down the columns of what it reads."""

    # at least this many neighbouring columns lie contiguous along x: Triton's flat
    # xindex asks nothing; the C++ target's innermost x loop, its vector lanes, 8
    run_min: int = 1
    # a store along the row (r-step 1, moving along x) keeps the kernel on rows, as such
    # a read does: the C++ target's lanes would scatter it, one row a lane
    stores_count: bool = False


@attrs.frozen
class NestTraits:
    """How a target that runs each kernel as a loop nest on CPU threads and vector
    lanes (OpenMP) shares out its work (passes/schedule/nest.py, threads.py)."""

    parallel_min_work: int  # below this many element-iterations a parallel region costs more than it saves
    parallel_chunks: int  # parallel loops hand out about this many dynamic chunks
    split_below_rows: int  # a reduction of fewer rows than this, of long rows, splits each row among threads ...
    split_parts: int  # ... in this many parts (at most)
    lanes: int  # columns a reduction down columns runs together (one accumulator slot each)
    tile: int  # side of a pointwise kernel's tiles when it reads transposed
    block: int  # a pointwise kernel's innermost loop cut into blocks of this many elements ...
    block_below: int  # ... when the loops outside it have fewer iterations than this
    # a float sum's r loop longer than this runs in blocks this long, each summed apart
    # (LoopNest.rblock): its rounding error then stays near eager's cascaded sum's
    sum_block: int = 0
    # ... and on a split's part (one long row shared among threads); 0: sum_block
    split_sum_block: int = 0
    # float32 lanes an `omp simd` sum spreads its row over: a row over several r loops
    # whose innermost is shorter fills fewer, so its blocks hold fewer elements
    sum_lanes: int = 8
    # ops spelled as calls the compiler will not if-convert a loop around (GCC 12: any
    # call but a builtin's; coil's sin and cos go by other names), so a masked read or a
    # select in such a loop keeps it scalar: a pointwise nest that applies one has its
    # innermost loop cut into pieces where its comparisons are constants
    # (passes/schedule/pieces.py)
    opaque_calls: tuple[str, ...] = ()


@attrs.frozen
class StreamTraits:
    """When a pointwise kernel on a loop nest writes an output with non-temporal
    (streaming) stores (passes/schedule/streams.py): a large output that the
    innermost loop walks contiguously, of a memory-bound kernel.  It would not
    stay in the cache for a reader anyway, and streaming it skips reading each
    line into the cache first; a compute-bound kernel runs slower with them."""

    min_bytes: int  # outputs of at least this many bytes ...
    max_cost: int  # ... of kernels that compute at most this much per element (OP_COST units)
    min_run_bytes: int  # the innermost loop writes at least this many contiguous bytes a run (each run is fenced)
    # bytes a chunk of the innermost loop computes into a local buffer before it is
    # streamed out: short bursts, a long one fills the core's write-combining buffers
    chunk_bytes: int
    # bytes written between two fences (a run of the innermost loop; a tiled nest's tile):
    # each costs a fence that waits for the streamed lines
    min_fenced_bytes: int = 0


@attrs.frozen
class ScratchTraits:
    """Row scratch arrays (passes/schedule/rows.py): a value an r-loop computes that
    a later r-loop of the same row needs again is kept in a row-sized array."""

    max_bytes: int  # all arrays of a kernel together, at most (a thread's stack, near the row in L1/L2)
    min_cost: int  # a value costs at least this much to recompute (OP_COST units; a load or an add is 1)


@attrs.frozen
class LaneTableTraits:
    """Lane tables (passes/schedule/lanes.py): a costly value of a pointwise kernel
    on a loop nest that varies along its innermost loop alone (BatchNorm's
    1 / sqrt(var + eps) by channel, channels innermost) is computed once per call
    into a table as long as that loop, which every iteration of the loops outside
    reads instead of computing it again."""

    max_length: int  # the innermost loop at most this long (a table on the stack)
    min_cost: int  # the value costs at least this much (OP_COST units) to compute
    min_outer: int  # the loops outside run at least this many iterations
    max_bytes: int  # a kernel's tables together, at most (in their compute dtypes)


@attrs.frozen
class ComboTraits:
    """Launching several independent pointwise kernels as one (passes/combine.py):
    a combo takes at most this many members and pointer arguments (each member's
    body is inlined into the combo's one kernel, so its compile time grows with them)."""

    max_members: int
    max_pointers: int


@attrs.frozen
class LaunchTraits:
    """The block sizes and warps the launch heuristics choose from
    (passes/schedule/launch.py).  Every block size is a power of two."""

    pointwise_block: int  # XBLOCK of a pointwise kernel, at most
    min_block: int  # and at least
    tile_block: int  # YBLOCK and XBLOCK of a tile, at most
    persistent_rows: int  # rows a persistent program, at most
    persistent_elements: int  # elements of a persistent program's tile, at most
    loop_block: int  # RBLOCK of a looped reduction of many rows
    few_rows: int  # at most this many rows (a full reduction's last stage) ...
    few_rows_block: int  # ... loop in steps this wide
    column_block: int  # neighbouring columns a program of a reduction down columns
    column_elements: int  # elements of its tile
    chain_reductions: int  # a persistent kernel with this many row reductions is a chain: one row a program
    unaligned_rows_min: int  # looped rows at least this long of a length not a multiple of 8 take more warps
    max_warps: int  # the most warps a heuristic gives a program
    # persistent rows whose RBLOCK is within these bounds, where there are at least
    # warp_rows_min of them, reduce a row a program on one warp (its reductions are
    # warp shuffles: no shared memory, no barrier)
    warp_row_lengths: tuple[int, int]
    warp_rows_min: int


@attrs.frozen
class TargetTraits:
    """What a target tells the passes about itself, so that no pass branches on a
    target's name: each pass reads the trait it needs (Options.traits()).  A
    trait that is None leaves that decision out, for a target that has no such
    thing (a Triton kernel has no loop nest; the C++ target plans no launches:
    OpenMP hands out its parallel loops' iterations)."""

    # kernel names: the prefix of a pointwise, looped-reduction and persistent kernel
    prefixes: tuple[str, str, str]
    # rows up to this many elements reduce in one tile (Options.persistent_limit)
    persistent_limit: int
    # most nodes in one kernel (Options.fusion_limit)
    fusion_limit: int
    # a reduction down the columns of what it reads loops, a block of columns a program
    # (kernel_model.reads_down_columns), instead of reducing a column a program, from
    # this many rows on; None: never
    column_loop_min: int | None
    # passes/layout.py computes the tensors around 2-d convolutions channels-last
    channels_last: bool
    # and in training too: a training forward saves its activations channels-last
    # (Options.free_output_strides) and the backward's convolutions run so.  On a GPU
    # that spares cuDNN's layout conversions; mkldnn's backward on one CPU thread ran
    # slower so (ResNet at the CPU size: 21.8 against 17.1 ms a step)
    channels_last_training: bool = False
    # what the one rule of a reduction down the columns of what it reads asks
    # (kernel_model.down_columns, on every target)
    columns: ColumnTraits = ColumnTraits()
    # realize's "reuse" rule (a pointwise node with several readers and more than one
    # nontrivial read becomes a buffer; Options.realize_reuse)
    realize_reuse: bool = True
    # ... where a read of something realize.BROADCAST_READ times smaller than the node
    # (a BatchNorm's mean, a bias, a row's max) is trivial: recomputed in each reader
    # it costs a cached load.  Off on the C++ target, whose softmax keeps exp(x - max)
    # in a row scratch array rather than computing it twice (Inductor's CPU rule
    # realizes a reused exp, log, tanh or sigmoid for the same reason)
    reuse_broadcasts_trivial: bool = False
    # a pointwise buffer that reductions read with its dims permuted walks them in
    # their order inside their kernel (realize.inner_orders), so it fuses there:
    # Triton's flat kernel index; the C++ target's nests keep each node's own order
    inner_orders: bool = False
    # a pointwise buffer laid out in an order other than its logical one walks its
    # memory order in a pointwise kernel (realize.walk_orders): Triton's flat index
    # and the C++ target's nests alike
    walk_orders: bool = False
    # reductions of few long rows split over many programs, and fuse keeps a second
    # pass over such rows out of the reduction before it (Options.split_second_pass)
    splits: SplitTraits | None = None
    # pointwise kernels that read transposed run on 2-d tiles
    tiles: TileTraits | None = None
    # launch configs are chosen at compile time, with their tails
    launch: LaunchTraits | None = None
    # neighbouring independent static pointwise kernels may launch as one (Options.combo_launches)
    combos: ComboTraits | None = None
    # a looped sum of exp(v - max v) runs in its max's loop, rescaled as the max grows
    online_softmax: bool = False
    # with Options.emulate_precision_casts off, a float32 -> half -> float32 round trip
    # between fused ops is dropped (values stay float32 until they are stored)
    keeps_float32_between_ops: bool = False
    # welford_m2 reads its row twice: the mean in one loop, the squared deviations
    # from it in the next (the C++ target, whose two plain passes vectorize; Triton's
    # Welford updates take one), so what reads it runs a loop later
    two_pass_welford: bool = False
    # a row that fits one tile (a persistent kernel's, or a pointwise kernel's
    # reduction over at most one element) is computed in one scope (Triton's
    # registers); else every reduction's row loops (the C++ target's r-loops,
    # whatever the row's length)
    row_tiles: bool = False
    # kernels run as loop nests, their work shared among threads and vector lanes
    nests: NestTraits | None = None
    # on a loop nest: a memory-bound pointwise kernel's large outputs are streamed
    streams: StreamTraits | None = None
    # on a loop nest: costly values a later r-loop needs again kept in row scratch arrays
    scratch: ScratchTraits | None = None
    # on a loop nest: a pointwise kernel's costly values that vary along the innermost
    # loop alone computed once per call into lane tables
    lane_tables: LaneTableTraits | None = None
    # on a loop nest: what an r-loop reads that does not vary along the row is computed
    # once per row, before the loop (a libm call or an index check inside would keep it
    # from vectorising) ...
    hoists_row_invariants: bool = False
    # ... and a division by such a value multiplies by its reciprocal, as eager's softmax does
    row_reciprocals: bool = False
    # a run-time check (an index, a divisor) is a device assert, which the launch must
    # compile in (Triton's tl.device_assert); else the renderer reports failed checks
    # its own way (the C++ target's error channel)
    device_asserts: bool = False
    # each scope (a one-scope kernel, each step of a reduction loop) issues its loads
    # from memory before its arithmetic, so their latency overlaps it, as Inductor's
    # Triton kernels do; every load from memory is a pointer plus an offset in kernel
    # coordinates, masked by the tails of the symbols it uses (passes/schedule/loads.py)
    loads_first: bool = False
    # kernels whose sizes are symbols, taken as arguments (dynamic shapes): a graph with
    # symbolic sizes compiles for a target that has this, and runs eagerly elsewhere
    symbolic_sizes: bool = False
    # a looped reduction over a symbolic row whose hint fits in one tile (persistent_limit)
    # but whose range does not also gets a persistent variant, and each call launches the
    # one that fits its row (KernelSpec.choice; Inductor's multi-kernel): a row held in
    # registers runs 1.3x-4.4x faster than looped at 4096 (bench/results/h200-dynamic-batches.md);
    # else such a row loops whatever its length (the C++ target's r-loops do anyway)
    multi_kernel: bool = False
    # a convolution Extern runs without its bias, and the bias is added by a pointwise
    # node that fuses into the convolution's reader (as Inductor does off the CPU): on
    # CUDA, aten added it in a kernel of its own after cuDNN's (ConvNeXt's inference on
    # the H200: 12 such launches, 44 us a call, bench/probes/model_kernels.py)
    conv_bias_in_kernels: bool = False
    # a kernel reads each tensor argument by its data pointer alone (Triton's launcher,
    # the C++ target's fastcall), so a view that only kernels read, at its base's
    # offset and in its dtype, is passed as its base: no view is made on each call
    # (passes/wrap.py, views_as_base); the reference target's kernels read shapes
    pointer_arguments: bool = False


# Triton's constants, read on the H200 (the figures: bench/probes/README.md): a
# split pass's column splits from 1024 rows (too few programs for ViT's LayerNorm
# weight gradients otherwise); a chain of 8 or more row reductions one row a
# program (bench/probes/streaming.py); 16 warps for looped rows of 4096 or more
# elements of an odd length (Wav2Vec2's GroupNorm, bench/probes/long_row_norm.py);
# 1024-wide steps of many rows on 2 warps (the online softmax of 32000-wide rows
# runs fastest so)
TRITON_SPLITS = SplitTraits(row_min=16384, max_rows=128, programs=1024, min_chunk=256, max_parts=1024,
                            max_rblock=2048, column_min=1024, column_xblock=32, column_rblock=64,
                            min_column_chunk=128, max_column_parts=256)
# the C++ target's: a tile of 64 (a multiple of 8: 4-byte tiles are transposed 8x8 in
# registers): each tile row is 256 contiguous bytes of every stream, and a float32
# tile (16 KiB) still sits in L1 (x + y.t(), 2048x2048 float32, one thread: 2.45 ms at
# 64, 2.56 at 32, 3.1 at 128)
# sum_block: x.sum() of 2^20 float32 elements was 470x further from the float64 sum
# than eager's (one serial add chain a part); in blocks of 1024 under omp simd it is
# within a few times eager's (tests/test_cpp_target.py).  Blocks of 256 cost 12-20 %
# on (8192, 4096).sum(-1) (one thread: 11.3 against 9.7 ms), nothing on a split's
# x.sum() of 2^22 (0.60 ms either way), where a part of 1024 in one block was 4.5x
# eager's error (x.sum() of 2^16 values of 0.1: 6.7e-7 off, relative; 1.5e-7 in
# blocks of 256, as eager)
CPP_NESTS = NestTraits(parallel_min_work=32768, parallel_chunks=64, split_below_rows=16, split_parts=64, lanes=64,
                       tile=64, block=4096, block_below=64, sum_block=1024, split_sum_block=256,
                       opaque_calls=("sin", "cos"))
# the C++ target's: runs of 8 columns at least; a kernel that stores along its rows stays
# on them, as it did while any read along r kept it there: layer_norm of
# gelu(x).permute(0, 2, 1) + a position embedding, x of (B, C, T), one thread, on rows
# against on lanes: 0.024 against 0.046 ms at (2, 64, 16), 7.0 against 20.5 ms at
# (8, 256, 512), only (8, 768, 64) faster on lanes (2.9 against 1.5 ms)
CPP_COLUMNS = ColumnTraits(run_min=8, stores_count=True)
# the C++ target's: outputs of 4 MiB or more (they would not stay in L2 for a reader),
# kernels of at most 7 per element (one exp is more), in chunks of 256 bytes; scratch
# arrays of at most 64 KiB a kernel, for values of at least one transcendental's cost
# min_fenced_bytes: the renderer fences each run of the innermost loop (a tiled nest: each
# tile) with coil_sfence, about 100 ns; relu(x * 2 + b) over 32 MiB of float32 rows, one
# thread, took 45.6 ms streamed in runs of 256 bytes, 24.2 in runs of 1 KiB, 19.1 in runs of
# 4 KiB, 18.3-18.5 from 16 KiB (session 56, 8M / C rows of C for C = 64 ... 16384): a
# channels-last row of 64 channels, which realize's walk order makes the innermost loop, is
# such a short run
CPP_STREAMS = StreamTraits(min_bytes=4 << 20, max_cost=7, min_run_bytes=64, chunk_bytes=256,
                           min_fenced_bytes=4 << 10)
CPP_SCRATCH = ScratchTraits(max_bytes=64 * 1024, min_cost=8)
# a division or a square root a channel (MobileNetV2's BatchNorm + hardtanh + pad at
# the CPU models size, 2 x 33 x 33 x 48 float32, one thread, AVX2: sqrt and divide
# in the channel loop took 0.7 ns an element)
CPP_LANE_TABLES = LaneTableTraits(max_length=4096, min_cost=4, min_outer=4, max_bytes=64 * 1024)
TRITON_TILES = TileTraits(min_side=16, max_grid_y=65535)  # CUDA's limit on grid dimension 1
TRITON_LAUNCH = LaunchTraits(pointwise_block=1024, min_block=16, tile_block=64, persistent_rows=64,
                             persistent_elements=4096, loop_block=1024, few_rows=8, few_rows_block=8192,
                             column_block=32, column_elements=2048, chain_reductions=8,
                             unaligned_rows_min=4096, max_warps=16, warp_row_lengths=(256, 1024),
                             warp_rows_min=1024)
# warp rows: LayerNorm after a residual add and RMSNorm over 2048 rows of 512 in bf16
# (the models suite's small size), 8 rows a program on 4 warps against one on one warp
# (bench/probes/norm_warps.py, H200): 7.58 -> 6.91 and 7.36 -> 6.53 µs a call; over
# ViT's 1576 rows, 7.71 -> 6.27 and 7.20 -> 6.18.  Inductor launches such rows on one
# warp too (it puts 1024 // RBLOCK rows in a program: 2 of 512 ran 7.46 µs here, so
# coil keeps one; rows of 256 were not timed apart).  Rows of 2048 gained less
# (11.17 -> 10.53) and a backward holds more of a row a thread: they keep the usual rule.

# combos: a compiled SGD step over 48 parameters launched 48 kernels of a few
# thousand elements each (bench/probes/optimizer_step.py, H100: 0.485 ms against
# Inductor's 0.379, whose foreach kernels update many parameters a launch); with
# combos of 16 it launches 3, and took 0.54 ms against Inductor's 0.76 in session 37
TRITON_COMBOS = ComboTraits(max_members=16, max_pointers=128)

# each target's traits: triton's limits are the GPU's (registers for 8192-wide rows;
# a long chain runs faster at 128 nodes a kernel than at 64, bench/probes/README.md);
# the C++ target's compile time grows with a kernel's size, and mkldnn's
# convolutions run about 2x faster channels-last on one CPU thread; on a GPU,
# cuDNN's do without the NCHW <-> NHWC conversions it makes around NCHW tensors
TARGET_TRAITS: dict[str, TargetTraits] = {
    "triton": TargetTraits(("triton_poi", "triton_red", "triton_per"), 8192, 128, column_loop_min=128,
                           channels_last=True, channels_last_training=True, splits=TRITON_SPLITS,
                           tiles=TRITON_TILES, launch=TRITON_LAUNCH,
                           online_softmax=True, keeps_float32_between_ops=True, row_tiles=True,
                           device_asserts=True, loads_first=True, symbolic_sizes=True, multi_kernel=True,
                           conv_bias_in_kernels=True, pointer_arguments=True, combos=TRITON_COMBOS,
                           reuse_broadcasts_trivial=True, inner_orders=True, walk_orders=True),
    "cpp": TargetTraits(("cpp", "cpp", "cpp"), 1024, 64, column_loop_min=None, channels_last=True,
                        columns=CPP_COLUMNS, two_pass_welford=True, nests=CPP_NESTS, streams=CPP_STREAMS,
                        scratch=CPP_SCRATCH, lane_tables=CPP_LANE_TABLES, hoists_row_invariants=True, row_reciprocals=True, symbolic_sizes=True,
                        pointer_arguments=True, walk_orders=True),
    "reference": TargetTraits(("ref_poi", "ref_red", "ref_per"), 1024, 64, column_loop_min=None,
                              channels_last=False, symbolic_sizes=True),
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
    # a view whose index over the node it views, inlined, has more sympy ops than
    # this (in one read's index) realizes that node first (a reshape of a padded
    # reshape over symbolic sizes: Wav2Vec2-Conformer's relative shift; passes/realize.py)
    realize_index_ops_threshold: int = 1000
    # fuse: most nodes in one kernel; 0: by target (triton 128: a long chain runs
    # faster than at 64 and compiles in the same time, bench/probes/README.md; else
    # 64, where a C++ kernel's compile time grows with its size)
    max_fusion_size: int = 0
    fusion_rounds: int = 10
    # rows up to this many elements reduce in one tile (the whole row in registers);
    # 0: by target (triton 8192: a GPU has the registers for it; else 1024)
    persistent_reduction_threshold: int = 0
    # triton: in a kernel of at most 128 rows at least this long, a second pass over
    # the rows (x - x.mean(), layer_norm of one row, a full softmax or logsumexp) is
    # not fused with the reduction before it, so the reduction splits over many
    # programs and the pass runs as its own kernel; 0: never (one program a row).
    # Worth it for rows of 2^20 elements, not at 2^16, where launches dominate
    # (bench/probes/long_rows.py; the figures: bench/probes/README.md)
    split_second_pass: int = 1 << 18
    # lower: in a graph with 2-d convolutions, compute the tensors around them
    # channels-last (passes/layout.py); "auto": by target (cpp and triton: on, as
    # Inductor's layout optimisation: mkldnn's convolutions run about 2x faster so
    # on one CPU thread, and cuDNN's without it converts NCHW to NHWC and back
    # around each call), "on", "off"
    channels_last: str = attrs.field(default="auto", validator=attrs.validators.in_(("auto", "on", "off")))
    # realize: "reuse" makes a pointwise node with several readers and more than one
    # nontrivial read a buffer; "auto": by target (on everywhere for now).  Inductor
    # applies that rule on the CPU only (should_realize_on_cpu) and recomputes such a
    # node in every reader on a GPU: with it off, ResNet's BatchNorm backward is 2
    # kernels, not 3 (bench/probes/README.md).  Off for Triton is not measured on a
    # GPU yet; "off" tries it.  "off" turns off the broadcast rule too (a transcendental
    # over few elements, a rotary table's sin, read over many: realize.py)
    realize_reuse: str = attrs.field(default="auto", validator=attrs.validators.in_(("auto", "on", "off")))
    # realize's lifetime rule: a pointwise node whose readers run far later (more than
    # realize.LIFETIME_SPAN nodes) and whose inputs die at it, holding at least twice
    # its bytes, becomes a buffer where it stands, so those inputs are freed early (T5's
    # tied embedding gradient: two float32 [vocab, d_model] scatters summed at the end)
    realize_lifetime: bool = True
    # training graphs: a copy that is its source again (clone, alias, a same-dtype
    # _to_copy with equal strides) is dropped from AOTAutograd's joint graph before
    # the partitioner picks what the forward saves (backends/joint_graph.py), so a
    # tensor and its copy are not both saved (T5's attention probabilities after
    # dropout at p=0), as Inductor's joint-graph passes do
    joint_noop_copies: bool = True
    # realize.inner_orders: a pointwise buffer that reductions read with its dims
    # permuted walks them in their order inside their kernel; "auto": by target (the
    # inner_orders trait: Triton), "on", "off" (an A/B of BatchNorm's backward)
    inner_orders: str = attrs.field(default="auto", validator=attrs.validators.in_(("auto", "on", "off")))
    # realize.walk_orders: a pointwise buffer laid out channels-last (any order but its
    # logical one) is walked in memory order by its pointwise kernel; "auto": by target
    # (the walk_orders trait: Triton and C++), "on", "off" (an A/B)
    walk_orders: str = attrs.field(default="auto", validator=attrs.validators.in_(("auto", "on", "off")))
    # overlap (passes/overlap.py): the most bytes of collectives' buffers in flight at
    # once when it moves issues earlier and waits later; 0: no overlap stage
    overlap_bytes_limit: int = 1 << 30
    # plan_memory; in a graph with collectives the overlap stage keeps the order
    # (least-peak and the others would undo its overlap) unless overlap_bytes_limit is 0
    reorder_for_peak_memory: bool = True
    # a pointwise kernel's output takes the storage of an input it is the last reader
    # of, read only at the element written (plan_memory.inplace_source): no allocation
    inplace_buffers: bool = True
    # kernels
    # triton: round every float16/bfloat16 intermediate inside a kernel as eager does
    # (Inductor's option of the same name; off: values stay float32 between fused
    # ops, as Inductor computes them, and round only where they are stored)
    emulate_precision_casts: bool = False
    autotune: bool = False
    # triton, static sizes, no autotuning: neighbouring independent pointwise kernels
    # launch as one combo kernel (passes/combine.py).  On the H100 (session 37) a
    # compiled SGD step over 48 tensors took 0.54 ms with them, 0.95 without
    combo_launches: bool = True
    # triton on CUDA: compile every kernel when output_code.py loads, one thread per
    # CPU core (Triton releases the GIL while it compiles), not each at its first launch
    precompile: bool = True
    # triton on CUDA, static sizes: a bound launch goes through torch's static CUDA
    # launcher on the cubin Triton compiled, and the cubins are kept in cache_dir
    # (backends/triton/images.py), so a warm start loads them without Triton's
    # per-kernel cache lookup; off: Triton's own launcher, Triton's cache
    kernel_images: bool = True
    cache_dir: str | None = None
    # load a graph compiled before (same graph, inputs, options, coil and torch) from
    # cache_dir instead of compiling it again (coil/graph_cache.py)
    graph_cache: bool = True
    # torch.compile: a training graph of at least this many Dynamo nodes goes into
    # torch's AOTAutogradCache (backends/aot_cache.py), so a warm start loads
    # AOTAutograd's result instead of tracing again; 0: every training graph; -1: none.
    # torch's key costs a process about 1 s at its first use on a 2-core VM (a cold start
    # pays it), AOTAutograd's trace 6-11 ms a node there.  At 300, 7 of the models
    # suite's 17 small training graphs (189-264 nodes) were traced at every warm start
    # (GPT-2's, 264 nodes, cpp: warm backend call 3.05 s, 1.04 s cached); at 72 nodes
    # the cache still saved 0.8 s of a warm start and cost 1.7 s of a cold one
    aot_cache_nodes: int = attrs.field(default=100, validator=attrs.validators.ge(-1))
    num_threads: int = 0
    sanitize: bool = False
    # torch.compile: a graph coil cannot compile (CoilError) runs eagerly, with a
    # warning that names the reason; off: the error reaches the caller
    eager_fallback: bool = True
    # torch.compile: graphs with symbolic sizes (dynamic=True, automatic dynamic) compile
    # once for every size on targets whose traits take symbolic sizes; off: they run
    # eagerly, with a warning (for bisecting and comparing)
    dynamic: bool = True
    # torch.compile on CUDA: record each compiled graph into a CUDA graph and replay
    # it (mode="reduce-overhead" turns it on; backends/cudagraphs.py says when a
    # graph is not recorded, and why)
    cuda_graphs: bool = False
    # process replay (scripts/process_replay.py): every compiled module's output_code.py
    # is also written to this folder, named by its graph, inputs and options; the
    # environment's COIL_DUMP_SOURCES applies to Options built directly too
    dump_sources: str | None = None
    # torch.compile, a training forward: the graph outputs whose strides coil chooses
    # (the activations saved for the backward, which only coil's backward reads; the
    # strides chosen are reported back to AOTAutograd, as Inductor's are), so that a
    # channels-last region need not be copied back into eager's strides
    free_output_strides: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    # torch.compile, a training backward: the graph inputs AOTAutograd donates
    # (functorch's donated_buffer: saved activations that nothing but this backward
    # reads, which it may overwrite, as Inductor's in-place buffers do), by position
    donated_inputs: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    # torch.compile: the graph inputs that keep the place they had when compiled, so the
    # 16-byte alignment their fake tensors' storage offsets give holds on every call
    # (parameters and buffers: AOTAutograd's static inputs of a forward or inference graph),
    # by position: the CUDA wrapper does not test their addresses on each call (as
    # Inductor leaves its static inputs out of its alignment checks)
    aligned_inputs: tuple[int, ...] = attrs.field(default=(), converter=tuple)

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

    def orders_inner_nodes(self) -> bool:
        """realize's inner orders: the option, else the target's trait."""
        if self.inner_orders != "auto":
            return self.inner_orders == "on"
        return self.traits().inner_orders

    def walks_memory_order(self) -> bool:
        """realize's walk orders: the option, else the target's trait."""
        if self.walk_orders != "auto":
            return self.walk_orders == "on"
        return self.traits().walk_orders

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
            if isinstance(default, tuple):  # set by the torch.compile backend, not by a person
                continue
            if isinstance(default, bool):
                changes[f.name] = raw.strip().lower() in ("1", "true", "yes", "on")
            elif isinstance(default, int):
                changes[f.name] = int(raw)
            else:
                changes[f.name] = raw
        return cls(**changes)
