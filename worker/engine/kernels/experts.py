"""A mixture-of-experts FFN's kernels: routing, the mat-vecs over the chosen experts' rows and
the weighted sum into the residual. Each function records its dispatches without barriers, as
matmul.py's do.

A slot is one (token t, its j-th chosen expert), numbered t * n_used + j; `route` writes each
slot's expert id and weight on the GPU and the expert mat-vecs read the ids there, so nothing
goes back to the host. In decode every slot is one column of mul_mat_vec.comp's EXPERTS
variants. A prefill chunk's slots are grouped by expert first (`group`, on the GPU too) into
tiles of up to tile_cols slots of one expert, each a workgroup column of the EXPERT_TILES
variants: an expert's weights are read once per tile rather than once per slot. On the tiled
and mmq mat-mat paths (matmul.py's mat_mat_path) the tiles hold up to MAT_MAT_TILE slots and each
is a workgroup column of mul_mat.comp's or mul_mmq.comp's EXPERT_TILES variants (`path`): the
expert's weights are read once per 64 of its slots."""
from gguf import GGMLQuantizationType as T

from worker.engine.intmath import cdiv
from worker.engine.kernels import elementwise
from worker.engine.kernels.launch import stride_groups, threads
from worker.engine.kernels.matmul import MAT_MAT_THREADS, MAT_MAT_TILE
from worker.engine.kernels.paths import MAT_VEC_MAX_COLS, mat_mat_path, mmq_types, paths
from worker.engine.kernels.tensor import DeviceTensor
from worker.engine.kernels.x8 import Quantized, quantize_x8
from worker.engine.vk.commands import Recording
from worker.engine.vk.memory import Buffer
from worker.engine.weight_types import QUANTIZED_TYPES

ROUTE_THREADS = 64
GROUP_THREADS = 256
# (subgroups, rows) per expert mat-vec workgroup. On GPUs one subgroup over two rows: an expert's
# rows are short (K of a few thousand, 768 for Qwen3-30B-A3B's down), so the dense kernel's four
# subgroups left most lanes idle, and small workgroups keep more rows in flight. On an H200,
# Qwen3-30B-A3B decode: 199.9 tok/s with (1, 2), 184.5 with (1, 4), 152.6 with (1, 8), 184.4 with
# (2, 4), 177.0 with the dense kernel's (4, 4). On a CPU driver fewer rows than the dense kernel's
# there (matmul.py) and fewer slots per tile: its 16 rows x 8 columns of two weights take lavapipe
# minutes to compile with the tiles' column lookups.
GPU_EXPERT_SHAPE = (1, 2)
CPU_EXPERT_SHAPE = (1, 4)
CPU_TILE_COLS = 4
# Values per item of the types whose 8-bit mat-vec takes mul_mat_vec_items.glsl's item loads. An
# expert row of fewer items than the workgroup's threads takes the 16-value slices instead
# (_slices variants): on an H200, Qwen3-30B-A3B's down products (K = 768: 12 Q4_K items, 6 of
# Q6_K, for 32 threads) took 10.5 and 13.6 us a layer through slices, 12.5 and 21.6 through items
# (decode 242.0 tok/s, 228.1); its gate+up (K = 2048, 32 Q4_K items) 11.7 us through items, 12.1
# through slices.
X8_ITEM_VALUES = {T.Q2_K: 128, T.Q3_K: 128, T.Q4_K: 64, T.Q5_K: 64, T.Q6_K: 128}


def expert_shape(ctx) -> tuple[int, int]:
    """(threads, rows) per expert mat-vec workgroup."""
    subgroups, rows = CPU_EXPERT_SHAPE if ctx.info.kind == "cpu" else GPU_EXPERT_SHAPE
    return subgroups * ctx.info.subgroup_size, rows


def tile_cols(ctx) -> int:
    """Slots per tile: the mat-vec kernel's columns, as many as the fused gate+up kernel's partial
    sums (two per row and column) leave room for in shared memory."""
    threads_per_group, rows_per_group = expert_shape(ctx)
    most = CPU_TILE_COLS if ctx.info.kind == "cpu" else MAT_VEC_MAX_COLS
    return max(1, min(most, ctx.info.max_shared_memory // (4 * 2 * rows_per_group * threads_per_group)))


# The mat-mat paths that have expert-tile kernels.
MAT_MAT_PATHS = ("tiled", "mmq")


def path(ctx, n: int) -> str:
    """The expert products' kernels for a pass of n tokens: "mat_vec" up to MAT_VEC_MAX_COLS
    tokens (decode: a mat-vec column per slot), else mat_mat_path's kernel over tiles where it
    is one of MAT_MAT_PATHS and the device takes mat-mat products at all (a CPU driver only when
    Settings.prefill_kernel names one, as matmul.py's rule), else "mat_vec_tiles". Where the
    dense products take the cooperative-matrix kernel, which has no expert tiles, the experts
    take the mmq tiles where the device has integer dot products (on an H200 a Qwen3-30B-A3B
    prompt of 512 prefilled at 2297 tok/s through them, 271 through the mat-vec tiles), else
    the tiled kernel's."""
    if n <= MAT_VEC_MAX_COLS:
        return "mat_vec"
    if ctx.info.kind == "cpu" and ctx.settings.prefill_kernel == "auto":
        return "mat_vec_tiles"
    chosen = mat_mat_path(ctx)
    if chosen == "coopmat":
        return "mmq" if "mmq" in paths(ctx) else "tiled"
    return chosen if chosen in MAT_MAT_PATHS else "mat_vec_tiles"


def group_cols(ctx, chosen: str) -> int:
    """Slots per tile of `group` for the kernels of path `chosen`."""
    return MAT_MAT_TILE if chosen in MAT_MAT_PATHS else tile_cols(ctx)


def max_tiles(n_slots: int, n_expert: int, cols: int) -> int:
    """Tiles at most: every expert that has slots adds at most one partial tile."""
    return cdiv(n_slots, cols) + min(n_expert, n_slots)


def tiles_bytes(n_slots: int, n_expert: int, cols: int) -> int:
    """Bytes of `group`'s output: the slots by expert, then three words per tile."""
    return 4 * (n_slots + 3 * max_tiles(n_slots, n_expert, cols))


def route(rec: Recording, logits: Buffer, ids: Buffer, weights: Buffer, n: int, n_expert: int, n_used: int,
          softmax_chosen: bool, norm: bool, bias: Buffer | None = None):
    """logits f32 [n, n_expert] (+ the router's bias, f32 [n_expert]) -> ids uint32 and weights
    f32 [n, n_used] (moe_route.comp)."""
    ctx = rec.ctx
    name, extra = ("moe_route", []) if bias is None else ("moe_route_bias", [bias])
    kernel = ctx.kernel(name, {0: ROUTE_THREADS, 1: cdiv(n_expert, ROUTE_THREADS)})
    x = min(n, ctx.info.max_workgroup_count)
    rec.dispatch(kernel, [logits, ids, weights, *extra], (x, cdiv(n, x), 1),
                 dict(n_expert=n_expert, n_used=n_used, softmax_chosen=int(softmax_chosen), norm=int(norm)))


def group(rec: Recording, ids: Buffer, tiles: Buffer, n_slots: int, n_expert: int, cols: int | None = None):
    """The slots' expert ids (route's) -> tiles of up to `cols` slots of one expert
    (moe_group.comp; tile_cols's by default, group_cols's for a path), in `tiles` of tiles_bytes."""
    cols = cols or tile_cols(rec.ctx)
    rec.dispatch(rec.ctx.kernel("moe_group", {0: GROUP_THREADS}), [ids, tiles], (1, 1, 1),
                 dict(n_slots=n_slots, n_expert=n_expert, cols=cols, max_tiles=max_tiles(n_slots, n_expert, cols)))


def _dispatch(rec: Recording, op: str, w: DeviceTensor, buffers, n_slots: int, n_used: int,
              x_per_slot: bool, tiled: bool):
    """One dispatch per part of `w`; `buffers(part)`: the bindings of that part. Workgroup
    columns are slots, or with `tiled` the tiles of `group`."""
    ctx = rec.ctx
    threads_per_group, rows_per_group = expert_shape(ctx)
    cols = tile_cols(ctx) if tiled else 1
    name = f"{op}{'_tiles' if tiled else ''}_{w.ggml_type.name.lower()}"
    kernel = ctx.kernel(name, {0: threads_per_group, 1: rows_per_group, 2: cols})
    per_expert = w.rows // w.experts
    row_groups = cdiv(per_expert, rows_per_group)
    x_groups = min(row_groups, ctx.info.max_workgroup_count)
    columns = max_tiles(n_slots, w.experts, cols) if tiled else n_slots
    for part in w.parts:
        _, first, count = part
        rec.dispatch(kernel, buffers(part), (x_groups, cdiv(row_groups, x_groups), columns),
                     dict(ncols=w.cols, rows=per_expert, n=n_slots, y_offset=0, y_stride=per_expert, accumulate=0,
                          n_used=n_used, expert_first=first // per_expert, expert_count=count // per_expert,
                          x_per_slot=int(x_per_slot)))


def _x8_op(ctx, op: str, w: DeviceTensor, x: Buffer | Quantized, tiles: Buffer | None) -> tuple[str, Buffer]:
    """The variant and x binding for x: f32, or Quantized (quantize_x8's; no tiles) for the
    8-bit variant, which quantized types have; through 16-value slices where a row has fewer
    items than the workgroup has threads (X8_ITEM_VALUES)."""
    if not isinstance(x, Quantized):
        return op, x
    if tiles is not None or w.ggml_type not in QUANTIZED_TYPES:
        raise ValueError(f"the 8-bit expert kernels take slots of quantized weights, not "
                         f"{'tiles' if tiles is not None else w.ggml_type.name}")
    item = X8_ITEM_VALUES.get(w.ggml_type)
    short = item is not None and w.cols // item < expert_shape(ctx)[0]
    return op + ("_x8_slices" if short else "_x8"), x.x8


def matmul_experts(rec: Recording, w: DeviceTensor, x: Buffer | Quantized, y: Buffer, ids: Buffer, n_slots: int,
                   n_used: int, x_per_slot: bool, bias: Buffer | None = None, tiles: Buffer | None = None):
    """y[z, r] = sum_k W[ids[z]][r, k] * x[c, k] (+ bias[ids[z], r]) for every slot z, with c = z
    (x_per_slot) or the slot's token z // n_used; y f32 [n_slots, rows per expert]. With `tiles`
    (group's, made from these ids) the kernel reads those instead of the ids. x Quantized (its
    rows the columns c): the kernel over 8-bit x, for the quantized types."""
    op, x = _x8_op(rec.ctx, "mul_mat_vec_id_bias" if bias is not None else "mul_mat_vec_id", w, x, tiles)
    extra = [bias] if bias is not None else []
    routing = ids if tiles is None else tiles
    _dispatch(rec, op, w, lambda part: [part[0], x, y, routing, *extra], n_slots, n_used, x_per_slot,
              tiles is not None)


def matmul_experts_glu(rec: Recording, w_gate: DeviceTensor, w_up: DeviceTensor, x: Buffer | Quantized,
                       out: Buffer, ids: Buffer, n_slots: int, n_used: int, biases: tuple[Buffer, Buffer] | None = None,
                       tiles: Buffer | None = None):
    """out[z, r] = silu(G x[t])[r] * (U x[t])[r] with G, U the gate and up of expert ids[z] and t
    the slot's token: the fused gate+up kernel over the chosen experts. With `biases` (the gate's
    and the up's, [n_expert, rows]) they are added first and the activation is gpt-oss's clamped
    SwiGLU. Both weights must have one type and shape (as a model file's always do). `tiles` and
    a Quantized x (per token) as for matmul_experts."""
    if (w_gate.ggml_type, w_gate.rows, w_gate.cols, w_gate.experts) != \
            (w_up.ggml_type, w_up.rows, w_up.cols, w_up.experts):
        raise ValueError(f"expert gate ({w_gate.ggml_type.name} {w_gate.rows}x{w_gate.cols}) and up "
                         f"({w_up.ggml_type.name} {w_up.rows}x{w_up.cols}) differ")
    op, x = _x8_op(rec.ctx, "mul_mat_vec_id_glu_oai" if biases is not None else "mul_mat_vec_id_glu", w_gate, x, tiles)
    extra = list(biases) if biases is not None else []
    ups = {first: buffer for buffer, first, _ in w_up.parts}
    routing = ids if tiles is None else tiles
    _dispatch(rec, op, w_gate,
              lambda part: [part[0], ups[part[1]], x, out, routing, *extra], n_slots, n_used, False,
              tiles is not None)


def _mat_mat(rec: Recording, chosen: str, products: list, x: Buffer, tiles: Buffer, n_slots: int, n_used: int,
             x_per_slot: bool, x8: Buffer | None):
    """y (+ bias) = the expert products of `products` ((w, y, bias or None), weights of one K)
    over x and group's tiles of MAT_MAT_TILE slots, through the mat-mat kernels of path `chosen`.
    On "mmq" x's rows (tokens, or slots with x_per_slot) are quantized once for all of them into
    x8 (then a barrier) and each kernel gathers its slots' 8-bit rows; a weight of a type without
    an mmq kernel takes the tiled one."""
    ctx, types = rec.ctx, mmq_types() if chosen == "mmq" else frozenset()
    quantized = [w for w, _, _ in products if w.ggml_type in types]
    if quantized:
        quantize_x8(rec, x, x8, n_slots if x_per_slot else n_slots // n_used, quantized[0].cols)
        rec.barrier()
    for w, y, bias in products:
        op, x_in = ("mul_mmq", x8) if w.ggml_type in types else ("mul_mat", x)
        kernel = ctx.kernel(f"{op}_id{'_bias' if bias is not None else ''}_tiles_{w.ggml_type.name.lower()}",
                            {0: MAT_MAT_THREADS, 1: MAT_MAT_TILE})
        per_expert = w.rows // w.experts
        groups = (cdiv(per_expert, MAT_MAT_TILE), max_tiles(n_slots, w.experts, MAT_MAT_TILE), 1)
        for buffer, first, count in w.parts:
            rec.dispatch(kernel, [buffer, x_in, y, tiles, *([bias] if bias is not None else [])], groups,
                         dict(ncols=w.cols, rows=per_expert, n=n_slots, y_offset=0, y_stride=per_expert, accumulate=0,
                              n_used=n_used, expert_first=first // per_expert, expert_count=count // per_expert,
                              x_per_slot=int(x_per_slot)))


def matmul_experts_mm(rec: Recording, chosen: str, w: DeviceTensor, x: Buffer, y: Buffer, tiles: Buffer,
                      n_slots: int, n_used: int, x_per_slot: bool, bias: Buffer | None = None,
                      x8: Buffer | None = None):
    """What matmul_experts computes, over `tiles` (group's with group_cols(ctx, chosen) slots
    each) through the mat-mat kernels of path `chosen` (one of MAT_MAT_PATHS; "mmq" takes x8 of
    x8_bytes(rows of x, w.cols))."""
    _mat_mat(rec, chosen, [(w, y, bias)], x, tiles, n_slots, n_used, x_per_slot, x8)


def matmul_experts_glu_mm(rec: Recording, chosen: str, w_gate: DeviceTensor, w_up: DeviceTensor, x: Buffer,
                          out: Buffer, up: Buffer, tiles: Buffer, n_slots: int, n_used: int,
                          biases: tuple[Buffer, Buffer] | None = None, x8: Buffer | None = None):
    """What matmul_experts_glu computes, as the dense mat-mat path does it (matmul_swiglu): the
    gate products into out and the up products into `up` (f32 [n_slots, rows]), both over x
    quantized once on "mmq", a barrier, then swiglu (with `biases` added by the products:
    gpt-oss's clamped swiglu_oai) into out. Tiles and x8 as matmul_experts_mm's."""
    if (w_gate.rows, w_gate.cols, w_gate.experts) != (w_up.rows, w_up.cols, w_up.experts):
        raise ValueError(f"expert gate {w_gate.rows}x{w_gate.cols} and up {w_up.rows}x{w_up.cols} differ in shape")
    bias_gate, bias_up = biases if biases is not None else (None, None)
    _mat_mat(rec, chosen, [(w_gate, out, bias_gate), (w_up, up, bias_up)], x, tiles, n_slots, n_used, False, x8)
    rec.barrier()
    size = n_slots * (w_gate.rows // w_gate.experts)
    (elementwise.swiglu_oai if biases is not None else elementwise.swiglu)(rec, out, up, out, size)


def combine(rec: Recording, y: Buffer, weights: Buffer, x: Buffer, n: int, n_used: int, n_embd: int,
            sigmoid: bool = False):
    """x[t] += sum_j weights[t, j] * y[t * n_used + j] (moe_combine.comp); with `sigmoid` the
    weights are logits and each counts as sigmoid(logit) (a shared expert's gate)."""
    size = threads(rec.ctx)
    name = "moe_combine_sigmoid" if sigmoid else "moe_combine"
    rec.dispatch(rec.ctx.kernel(name, {0: size}), [y, weights, x],
                 (stride_groups(rec.ctx, n * n_embd, size), 1, 1), dict(n_embd=n_embd, n_used=n_used, n=n))
