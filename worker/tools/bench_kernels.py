"""`vkllm bench kernels`: mat-vec (decode) speed per weight type at LLM shapes, in GB/s of
weight bytes read, and as a share of the plain read bandwidth measured on this device in the
same run (the decode roofline), and as a share of a plain read of the same bytes timed the same
way ("% same": per dispatch, launch, ramp and barrier cost a small weight what they cost a read
of its size, so that is about the most its product can reach).

Each shape is timed on several distinct copies of the weights, dispatched in turn, so that
the bytes read between two uses of one copy are well past the GPU's L2 cache (60 MB on the
H200): a real decode step never finds its weights in cache. GPU timestamps bracket each
dispatch (with its barrier); the figure is the median.

Warm-up matters on the H200: its SM clock falls to 345 MHz about a second after the GPU goes
idle (here: while the host uploads the next weights) and rises to 1980 MHz only under load,
which moved compute-heavy kernels by 5x. So each shape's command buffer is replayed for
`warmup` seconds before it is timed (which also covers the slow first submissions)."""
import argparse

import numpy as np
from gguf import GGMLQuantizationType

from vkllm.argtypes import count, counts, whole
from worker.engine.config import Settings
from worker.engine.intmath import cdiv
from worker.engine.kernels.halves import f16_bytes
from worker.engine.kernels.mat_vec import mat_vec_shape
from worker.engine.kernels.paths import mmq_types, paths
from worker.engine.kernels.tensor import free_tensor, upload_tensor
from worker.engine.kernels.timing import median_seconds, random_weights, record_products
from worker.engine.kernels.tuning import MatVecTuner, shape_label
from worker.engine.kernels.x8 import Quantized, quantize_x8, x8_bytes
from worker.engine.weight_types import WEIGHT_TYPES, row_bytes
from worker.tools import bench_cols, bench_glu
from worker.tools.roofline import WARMUP_SECONDS, read_bandwidth, read_seconds

# rows x K: attention projection, FFN up/gate, FFN down, the Llama-3 output head.
SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096))
QUICK_SHAPES = ((256, 1024), (1024, 256), (20000, 256))
ROTATION_BYTES = 512 << 20   # bytes cycled through per shape: many times the L2
QUICK_ROTATION_BYTES = 2 << 20
QUICK_WARMUP_SECONDS = 0.02


def add_arguments(parser):
    parser.add_argument("--types", nargs="+", default=[t.name for t in WEIGHT_TYPES], type=str.upper,
                        choices=sorted(t.name for t in WEIGHT_TYPES), metavar="TYPE",
                        help="weight types to time (default: all)")
    parser.add_argument("--quick", action="store_true", help="small shapes (for CPU drivers / a smoke test)")
    parser.add_argument("--shapes", type=parse_shapes, metavar="RxK,RxK,...",
                        help="weights of these rows x K instead of the Llama-3.1-8B ones (e.g. 27648x5120,5120x27648: "
                             "Qwen2.5-32B's gate/up and down)")
    parser.add_argument("--runs", type=count, default=5, help="timed submissions after the warm-up")
    parser.add_argument("--prefill", type=whole, default=0, metavar="N",
                        help="also time each mat-mat kernel the device offers (tiled; mmq, 8-bit integer dot "
                             "products, for quantized types; coopmat) on N token columns (TFLOP/s)")
    parser.add_argument("--cols", type=counts, metavar="N,N,...",
                        help="instead: batched-decode products of N columns on Llama-3.1-8B's Q4_K_M weights "
                             "through each kernel (mat-vec, mat-cols, cooperative matrices) and one 8B pass "
                             "per rule (worker/tools/bench_cols.py); --types filters its weights")
    parser.add_argument("--glu", action="store_true",
                        help="instead: decode's fused gate+up product, with and without its 8-bit block output, "
                             "against one product of the gate and up weights stacked (worker/tools/bench_glu.py); "
                             "--shapes gives the gate's rows x K (default: the 8B's and the 32B's)")
    parser.add_argument("--cols-shapes", action="store_true",
                        help="with --cols: also time each mat-cols workgroup shape (subgroups x rows)")
    parser.add_argument("--tuned", action="store_true",
                        help="time each weight with the workgroup shape the tuner picks for it (as a model "
                             "runs; measured now or read from the tuning cache), not the fixed default")


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    try:
        shapes = tuple(tuple(int(v) for v in shape.lower().split("x")) for shape in text.split(","))
    except ValueError:
        shapes = ()
    if not shapes or any(len(shape) != 2 or min(shape) < 1 for shape in shapes):
        raise argparse.ArgumentTypeError(f"shapes are ROWSxK, comma-separated, not {text!r}")
    return shapes


def time_matmul(ctx, qtype: GGMLQuantizationType, rows: int, cols: int, n: int, rotation_bytes: int,
                runs: int, warmup: float, shape=None, path: str | None = None) -> tuple[float, int]:
    """(median seconds per product, copies rotated) for a rows x cols weight of `qtype` and n
    token columns (1: the mat-vec kernel), with mat-vec workgroup shape `shape` (None: fixed),
    through matmul's kernel `path` (None: the one it picks). "mmq" includes quantizing x,
    "coopmat" converting it to f16;
    "mat_vec_x8" takes x already in 8-bit blocks, as a model's products do (rms_norm_x8 writes
    them)."""
    nbytes = rows * row_bytes(qtype, cols)
    copies = max(2, cdiv(rotation_bytes, nbytes))
    data = random_weights(qtype, nbytes)
    weights = [upload_tensor(ctx, f"w{i}", qtype, (cols, rows), data) for i in range(copies)]
    for w in weights:
        w.mat_vec_shape = shape
    x, y = ctx.alloc(4 * cols * n), ctx.alloc(4 * rows * n)
    x8 = ctx.alloc(x8_bytes(n, cols)) if qtype in mmq_types() else None
    xh = ctx.alloc(f16_bytes(n, cols)) if path == "coopmat" else None
    ctx.upload(x, np.ones(cols * n, np.float32))
    if path == "mat_vec_x8":
        prepare = ctx.recording(max_sets=1)
        quantize_x8(prepare, x, x8, n, cols)
        prepare = prepare.finish()
        ctx.run(prepare)
        prepare.destroy()
    rec = record_products(ctx, weights, Quantized(x8) if path == "mat_vec_x8" else x, y, n, path=path, x8=x8, xh=xh)
    seconds = median_seconds(ctx, rec, runs, warmup)
    rec.destroy()
    for w in weights:
        free_tensor(ctx, w)
    for buffer in (x, y, x8, xh):
        if buffer is not None:
            ctx.free(buffer)
    return seconds, copies


def mat_mat_paths(ctx, qtype: GGMLQuantizationType) -> list[str]:
    """The mat-mat kernels --prefill times for a weight of `qtype` on this device."""
    return [p for p in paths(ctx) if p == "tiled" or p == "coopmat" or (p == "mmq" and qtype in mmq_types())]


def run(args):
    from worker.engine.vk.context import Context
    ctx = Context(Settings.from_env())
    shapes = args.shapes or (QUICK_SHAPES if args.quick else SHAPES)
    rotation = QUICK_ROTATION_BYTES if args.quick else ROTATION_BYTES
    warmup = QUICK_WARMUP_SECONDS if args.quick else WARMUP_SECONDS
    try:
        measured = read_bandwidth(ctx, rotation, warmup=warmup)
        print(f"device: {ctx.info.describe()}; plain read of {rotation >> 20} MiB: {measured / 1e9:.1f} GB/s")
        if args.cols:
            bench_cols.run(ctx, args, rotation, warmup, measured)
            return
        if args.glu:
            bench_glu.run(ctx, args, measured)
            return
        tuner = MatVecTuner(ctx, ctx.settings.cache_dir) if args.tuned else None
        print(f"{'type':6} {'rows x K':>13} {'MB':>8} {'copies':>6} {'shape':>10} {'us':>9} {'GB/s':>8} {'% read':>7} "
              f"{'% same':>7}")
        # a plain read of each weight's bytes, timed as its product: about the most a product of that size reaches
        same = {}
        for name in args.types:
            qtype = GGMLQuantizationType[name]
            for rows, cols in shapes:
                nbytes = rows * row_bytes(qtype, cols)
                if nbytes not in same:
                    same[nbytes] = read_seconds(ctx, nbytes, rotation, args.runs, warmup)
                shape = tuner.shapes([(qtype, rows, cols)])[qtype, rows, cols] if tuner else None
                seconds, copies = time_matmul(ctx, qtype, rows, cols, 1, rotation, args.runs, warmup, shape,
                                              path="mat_vec")
                rate = nbytes / seconds
                line = (f"{name:6} {f'{rows}x{cols}':>13} {nbytes / 1e6:8.1f} {copies:6} "
                        f"{shape_label(shape or mat_vec_shape(ctx)):>10} "
                        f"{seconds * 1e6:9.1f} {rate / 1e9:8.1f} {100 * rate / measured:6.1f}% "
                        f"{100 * same[nbytes] / seconds:6.1f}%")
                if "mmq" in paths(ctx) and qtype in mmq_types():
                    seconds, _ = time_matmul(ctx, qtype, rows, cols, 1, rotation, args.runs, warmup, shape,
                                             path="mat_vec_x8")
                    line += (f"   x8: {seconds * 1e6:7.1f} us {100 * nbytes / seconds / measured:5.1f}% "
                             f"({100 * same[nbytes] / seconds:5.1f}% same)")
                for path in mat_mat_paths(ctx, qtype) if args.prefill else ():
                    seconds, _ = time_matmul(ctx, qtype, rows, cols, args.prefill, rotation, args.runs, warmup,
                                             path=path)
                    line += (f"   {path} n={args.prefill}: {seconds * 1e6:9.1f} us "
                             f"{2 * rows * cols * args.prefill / seconds / 1e12:6.2f} TFLOP/s")
                print(line, flush=True)
    finally:
        ctx.close()
