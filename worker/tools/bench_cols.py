"""`vkllm bench kernels --cols 1,2,4,8,16,32`: the products of batched decode (n token columns)
on Llama-3.1-8B's Q4_K_M weights, through each kernel that can take them: the mat-vec kernel
(its column groups of up to 8, the rule before the mat-cols kernel up to 8 columns; over f32
x, and for the quantized types over 8-bit x, quantization included, decode's default on GPUs
with integer dot products), the mat-cols kernel (mul_mat_cols.comp; over f32 x, and for Q4_K,
Q5_K and Q6_K over 8-bit x: its default shape, with --tuned the one cols_tuning.py measures or
has cached for the weight) and the cooperative-matrix mat-mat kernel (the old
rule's choice past 8 columns). Per weight and n: microseconds, the fastest kernel's time as a
ratio to the one-column f32 mat-vec (1.0 = the batch costs one weight read) and as a share of
the measured read bandwidth, and the f32 mat-cols result's relative difference from the
mat-vec kernel's on the same random input (a check on this device's compiler). Then one 8B
pass per n, summed from its weights, as each rule would run it. Timing as `vkllm bench kernels`: distinct weight copies cycled through,
warm-up, medians of GPU timestamps."""

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from worker.engine.intmath import cdiv
from worker.engine.kernels.cols_tuning import MAT_COLS_X8_TUNED, ColsTuner
from worker.engine.kernels.mat_cols import MAT_COLS_X8_VARIANTS, mat_cols_columns, mat_cols_shape, mat_cols_tile
from worker.engine.kernels.halves import f16_bytes
from worker.engine.kernels.paths import MAT_COLS_X8_MAX, MAT_VEC_MAX_COLS, mmq_types, paths, x8_cols_types
from worker.engine.kernels.tensor import free_tensor, upload_tensor
from worker.engine.kernels.timing import median_seconds, random_weights, record_glu_products, record_products
from worker.engine.kernels.x8 import x8_bytes
from worker.engine.weight_types import row_bytes

# Llama-3.1-8B Q4_K_M, per layer (32): Q/K/V as one product, the output projection, gate+up
# with SwiGLU, the down projection (Q4_K in half the layers, Q6_K in the other half, as
# llama.cpp's mix does about); then the output head. (name, type, rows, K, glu, count per pass)
WEIGHTS_8B = (("attn_qkv", T.Q4_K, 6144, 4096, False, 32), ("attn_output", T.Q4_K, 4096, 4096, False, 32),
              ("ffn_gate+up", T.Q4_K, 14336, 4096, True, 32), ("ffn_down", T.Q4_K, 4096, 14336, False, 16),
              ("ffn_down", T.Q6_K, 4096, 14336, False, 16), ("output", T.Q6_K, 128256, 4096, False, 1))
# --quick (CPU drivers, a smoke test): the same kinds of weight, small.
QUICK_WEIGHTS = (("attn_qkv", T.Q4_K, 96, 256, False, 32), ("ffn_gate+up", T.Q4_K, 80, 512, True, 32),
                 ("ffn_down", T.Q6_K, 64, 768, False, 32))
# Byte offsets of each block's f16 scales: random bytes there would be inf/NaN now and then,
# which costs no time but would make the check meaningless.
SCALE_FIELDS = {T.Q4_K: (0, 2), T.Q6_K: (208,)}
# (subgroups, rows per lane group, lanes per row; 0: the subgroup) of the mat-cols workgroups
# --cols-shapes also times
COLS_SHAPES = tuple((s, r, lanes) for lanes in (0, 8, 4, 1) for s in (1, 2, 4, 8) for r in (1, 2, 4))


def run(ctx, args, rotation: int, warmup: float, measured: float) -> dict:
    """Prints the table; returns {(weight, type): {n: the check}} (mat-cols vs mat-vec)."""
    counts, checks = args.cols, {}
    passes = {rule: {n: 0.0 for n in counts} for rule in ("old rule", "mat_cols", "best")}
    have_coopmat, have_x8 = "coopmat" in paths(ctx), "mmq" in paths(ctx)
    tuner = ColsTuner(ctx, ctx.settings.cache_dir) if args.tuned else None
    print(f"{'weight':12} {'type':5} {'rows x K':>12} {'n':>3} {'mat_vec us':>10} {'x8 us':>8} {'mat_cols us':>11} "
          f"{'shape':>8} {'cols_x8 us':>10} {'coopmat us':>10} {'best/1col':>9} {'% read':>7} {'check':>8}")
    for name, qtype, rows, cols, glu, per_pass in QUICK_WEIGHTS if args.quick else WEIGHTS_8B:
        if qtype.name not in args.types:
            continue
        with Copies(ctx, qtype, rows, cols, glu, rotation, max(counts)) as w:
            one = w.time(1, "mat_vec", None, args.runs, warmup)
            for n in counts:
                times = {"mat_vec": one if n == 1 else w.time(n, "mat_vec", None, args.runs, warmup)}
                if have_x8 and qtype in mmq_types() and n <= MAT_VEC_MAX_COLS:   # 8-bit x, quantization included
                    times["mat_vec_x8"] = w.time(n, "mat_vec_x8", None, args.runs, warmup)
                if n > 1:
                    times["mat_cols"] = w.time(n, "mat_cols", None, args.runs, warmup)
                    if have_x8 and qtype in x8_cols_types() and n <= MAT_COLS_X8_MAX:
                        c = mat_cols_columns(n, MAT_COLS_X8_VARIANTS)
                        tuned = tuner.shape((qtype, rows, cols), c, glu) if tuner and c in MAT_COLS_X8_TUNED else None
                        times["mat_cols_x8"] = w.time(n, "mat_cols_x8", tuned, args.runs, warmup)
                    if have_coopmat:
                        times["coopmat"] = w.time(n, "coopmat", None, args.runs, warmup)
                old = times["mat_vec"] if n <= MAT_VEC_MAX_COLS or not have_coopmat else times["coopmat"]
                new, best = times.get("mat_cols", one), min(times.values())
                for rule, t in (("old rule", old), ("mat_cols", new), ("best", best)):
                    passes[rule][n] += per_pass * t
                c = mat_cols_columns(n) if n > 1 else 1
                threads, rows_each, row_lanes = mat_cols_shape(ctx, c, 1 + glu)
                shape = f"{threads // ctx.info.subgroup_size}x{rows_each}/{row_lanes}" if n > 1 else "-"
                if n > 1:
                    checks.setdefault((name, qtype.name), {})[n] = w.check(n)
                check = f"{checks[name, qtype.name][n]:8.1e}" if n > 1 else "       -"
                print(f"{name:12} {qtype.name:5} {f'{rows}x{cols}':>12} {n:3d} {us(times['mat_vec'])} "
                      f"{us(times.get('mat_vec_x8'), 8)} {us(times.get('mat_cols'), 11)} {shape:>8} "
                      f"{us(times.get('mat_cols_x8'))} {us(times.get('coopmat'))} {best / one:9.2f} {100 * w.nbytes / best / measured:6.1f}% {check}",
                      flush=True)
                if args.cols_shapes and n > 1:
                    lanes = ctx.info.subgroup_size
                    shapes = dict.fromkeys((s * lanes, r, min(lanes, row_lanes or lanes))
                                           for s, r, row_lanes in COLS_SHAPES)
                    sweep = {s: w.time(n, "mat_cols", s, args.runs, warmup) for s in shapes if mat_cols_tile(ctx, c, s)}
                    print(f"{'':12} shapes (subgroups x rows / lanes per row: us): " + ", ".join(
                        f"{t // lanes}x{r}/{row_lanes}: {sec * 1e6:.0f}" for (t, r, row_lanes), sec in sweep.items()),
                          flush=True)
    print("one 8B pass (its weights' products; ms): " + "; ".join(
        f"{rule} " + " ".join(f"n={n}: {t * 1e3:.2f}" for n, t in by_n.items()) for rule, by_n in passes.items()))
    return checks


def sane_scales(qtype, data: np.ndarray) -> np.ndarray:
    blocks = data.reshape(-1, GGML_QUANT_SIZES[qtype][1])
    scales = np.random.default_rng(1).uniform(0.001, 0.02, len(blocks)).astype(np.float16).view(np.uint8)
    for offset in SCALE_FIELDS[qtype]:
        blocks[:, offset:offset + 2] = scales.reshape(-1, 2)
    return data


def us(seconds: float | None, width: int = 10) -> str:
    return f"{'-':>{width}}" if seconds is None else f"{seconds * 1e6:{width}.1f}"


class Copies:
    """Distinct copies of one weight (of two, gate and up, under GLU: copy i + 1 is copy i's up)
    past the L2 cache, with x, y and scratch for up to `most` columns; freed at exit."""

    def __init__(self, ctx, qtype, rows: int, cols: int, glu: bool, rotation: int, most: int):
        self.ctx, self.rows, self.cols, self.glu = ctx, rows, cols, glu
        self.nbytes = (2 if glu else 1) * rows * row_bytes(qtype, cols)
        copies = max(3, cdiv(rotation, rows * row_bytes(qtype, cols)))
        data = sane_scales(qtype, random_weights(qtype, rows * row_bytes(qtype, cols)))
        self.weights = [upload_tensor(ctx, f"w{i}", qtype, (cols, rows), data) for i in range(copies)]
        self.x, self.y, self.up = (ctx.alloc(4 * c * most) for c in (cols, rows, rows))
        self.x8 = ctx.alloc(x8_bytes(min(most, MAT_COLS_X8_MAX), cols))
        self.xh = ctx.alloc(f16_bytes(most, cols))
        ctx.upload(self.x, (np.random.default_rng(0).standard_normal(cols * most) / np.sqrt(cols)).astype(np.float32))

    def _record(self, n: int, **options):
        if self.glu:
            return record_glu_products(self.ctx, self.weights, self.x, self.y, n, up=self.up, x8=self.x8, xh=self.xh,
                                       **options)
        return record_products(self.ctx, self.weights, self.x, self.y, n, x8=self.x8, xh=self.xh, **options)

    def time(self, n: int, path: str, shape, runs: int, warmup: float) -> float:
        """Median seconds of one product (a gate+up pair under GLU) of n columns."""
        rec = self._record(n, path=path, cols_shape=shape)
        try:
            return median_seconds(self.ctx, rec, runs, warmup)
        finally:
            rec.destroy()

    def check(self, n: int) -> float:
        """||mat_cols - mat_vec|| / ||mat_vec|| of the last copy's product, n columns (y filled
        with NaN first: a kernel that writes nothing cannot pass)."""
        results = []
        for path in ("mat_vec", "mat_cols"):
            self.ctx.upload(self.y, np.full(n * self.rows, np.nan, np.float32))
            rec = self._record(n, path=path)
            self.ctx.run(rec)
            rec.destroy()
            results.append(self.ctx.download(self.y, count=n * self.rows).astype(np.float64))
        return float(np.linalg.norm(results[1] - results[0]) / np.linalg.norm(results[0]))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for w in self.weights:
            free_tensor(self.ctx, w)
        for buffer in (self.x, self.y, self.up, self.x8, self.xh):
            self.ctx.free(buffer)
