"""Workgroup shapes of the mat-vec kernel (mul_mat_vec.comp: decode, one column or a few): the
fixed shapes, the rows a shape covers, the kernel's name and pipeline for a shape and how many
columns a workgroup takes. kernels/matmul.py records its products with them; tuning.py times
other shapes."""
from gguf import GGMLQuantizationType as T

from worker.engine.kernels.paths import MAT_VEC_MAX_COLS

# Fixed mat-vec shapes in (subgroups, rows) per workgroup, for weights without a tuned one.
# GPUs: four subgroups, four rows, each thread applying one load of x to all four; best or
# within a few % of it among 1-8 rows and 64-256 threads in one H200 sweep (taken, as it turned
# out, at the idle SM clock). CPU drivers (lavapipe): a workgroup is one subgroup, so no barrier
# is needed, with 16 rows to amortise the per-workgroup cost (15x faster there than the GPU shape).
GPU_MAT_VEC_SHAPE = (4, 4)
CPU_MAT_VEC_SHAPE = (1, 16)


def mat_vec_shape(ctx) -> tuple[int, int, int]:
    """(threads, rows, lanes) per mat-vec workgroup for a weight that has no tuned shape: the
    whole workgroup shares its rows. Rows beyond maxComputeWorkGroupCount spill into the y
    dimension."""
    subgroups, rows = CPU_MAT_VEC_SHAPE if ctx.info.kind == "cpu" else GPU_MAT_VEC_SHAPE
    threads = subgroups * ctx.info.subgroup_size
    return threads, rows, threads


def workgroup_rows(shape: tuple[int, int, int]) -> int:
    """Rows of a mat-vec workgroup of `shape` (threads, rows, lanes): each group of `lanes` lanes
    (all the threads, or a divisor of the subgroup size: mul_mat_vec_base.glsl's ROW_LANES)
    shares the K of `rows` rows of its own."""
    threads, rows, lanes = shape
    return rows * (threads // lanes)


def mat_vec_kernel(ctx, name: str, shape: tuple[int, int, int], cols: int):
    """The pipeline of mat-vec kernel `name` for workgroups of `shape` over `cols` columns."""
    threads, rows, lanes = shape
    return ctx.kernel(name, {0: threads, 1: rows, 2: cols, 4: 0 if lanes == threads else lanes})


def mat_vec_columns(ctx, n: int, shape: tuple[int, int, int], norm_sums: bool, mats: int = 1) -> int:
    """Columns per mat-vec workgroup of `mats` weights (2: the fused gate+up): its reduction keeps
    a float per thread, row, weight and column in shared memory, which the tuner's candidates keep
    within the device's limit for 8 columns of one weight; a norm's sums (`norm_sums`: a folded
    norm's, or an _rms variant's) take one more per thread and column (at least 4 columns of one
    weight still fit); 0 where not even one column fits."""
    if mats == 1 and not norm_sums:
        return min(n, MAT_VEC_MAX_COLS)
    threads, rows, _ = shape
    return min(n, MAT_VEC_MAX_COLS, ctx.info.max_shared_memory // (4 * (mats * rows + norm_sums) * threads))


def mat_vec_name(op: str, qtype: T, cols: int) -> str:
    """Mat-vec kernel `op` of a weight of `qtype` for workgroups of `cols` columns: the 8-bit
    kernels (op *_x8) take their _slices variant for several (variants.toml)."""
    slices = "_slices" if op.endswith("_x8") and cols > 1 else ""
    return f"{op}{slices}_{qtype.name.lower()}"
