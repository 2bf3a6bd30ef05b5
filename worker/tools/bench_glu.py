"""`vkllm bench kernels --glu`: what decode's fused gate+up product costs against a plain product
of the same bytes. Per weight type and gate shape (rows x K), each through every mat-vec tuner
candidate (tuning.py's timing: distinct copies cycled through, warm clock, medians), the best:

  fused+blocks  the fused kernel (gate and up from two weights, SwiGLU) writing its output in
                8-bit blocks too, as one-column decode over 8-bit x runs it (matmul.BlocksOut)
  fused         the same kernel without the blocks
  stacked       one product of a weight of 2 x rows (gate and up as one weight, f32 out)

All three read the same bytes: fused against stacked is what the fusion's loops cost, fused+blocks
against fused what the blocks' epilogue (a counter per 32-row block, or a workgroup barrier)
costs. H100, Q4_K, best of each: 27648x5120 fused+blocks 69.9 us against stacked 61.8, 14336x4096
34.8 against 30.2 (the 32B's and 8B's gate+up)."""
from gguf import GGMLQuantizationType

from worker.engine.kernels.tuning import MatVecTuner, shape_label
from worker.engine.weight_types import row_bytes

# the gate weights of Llama-3.1-8B and Qwen2.5-32B
GLU_SHAPES = ((14336, 4096), (27648, 5120))
QUICK_GLU_SHAPES = ((64, 512),)
VARIANTS = ("fused+blocks", "fused", "stacked")


def time_variants(tuner: MatVecTuner, qtype: GGMLQuantizationType, rows: int, cols: int) -> dict:
    """variant -> {shape: median seconds} for a gate (and up) of rows x cols; fused+blocks is
    absent where decode writes no blocks (tuner.times_blocks: f32 x, or rows of part of a block)."""
    key = (qtype, rows, cols)
    tables = {"fused": tuner.measure(key, glu=True, with_blocks=False),
              "stacked": tuner.measure((qtype, 2 * rows, cols))}
    if tuner.times_blocks(key, glu=True):
        tables["fused+blocks"] = tuner.measure(key, glu=True)
    return tables


def run(ctx, args, measured: float):
    """One line per type and shape: each variant's best shape, microseconds and share of the
    plain read (`measured`, bytes/s)."""
    tuner = MatVecTuner(ctx, ctx.settings.cache_dir)
    shapes = args.shapes or (QUICK_GLU_SHAPES if args.quick else GLU_SHAPES)
    print(f"{'type':6} {'gate rows x K':>13} {'MB':>8}  " + "  ".join(f"{v:>28}" for v in VARIANTS))
    for name in args.types:
        qtype = GGMLQuantizationType[name]
        for rows, cols in shapes:
            nbytes = 2 * rows * row_bytes(qtype, cols)
            tables = time_variants(tuner, qtype, rows, cols)
            cells = []
            for variant in VARIANTS:
                table = tables.get(variant)
                if table is None:
                    cells.append(f"{'-':>28}")
                    continue
                best = min(table, key=table.get)
                seconds = table[best]
                share = 100 * nbytes / seconds / measured
                cells.append(f"{shape_label(best):>10} {seconds * 1e6:9.1f} us {share:5.1f}%")
            print(f"{name:6} {f'{rows}x{cols}':>13} {nbytes / 1e6:8.1f}  " + "  ".join(cells), flush=True)
