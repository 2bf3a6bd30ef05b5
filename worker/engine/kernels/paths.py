"""Which kernel a weight product takes (`product_path`): what the device offers (`paths`), the
rules by column count, Settings' choices and the weight's type. kernels/matmul.py records the
products; the tuner and the benchmarks ask here which kernel they time."""
from functools import cache

from gguf import GGMLQuantizationType as T

from vkllm.errors import VkllmError
from worker.engine import compilers, shaderbuild
from worker.engine.vk.device import COOPMAT, INTEGER_DOT

# The tuner's candidates (kernels/tile_tuning.py), sides that 16x16 and 8x8 shapes divide. The
# last six won on the H200 in a sweep of 52 tiles at 512 columns (Q4_K 4096x14336 96 TFLOP/s
# against 77 through the tile tuned before them, Q6_K 91 against 71, 4096x4096 92 against 90;
# the two of 16 subgroups 14336x4096 113 against 89, 4096x4096 102).
COOPMAT_TILES = tuple((*t, stages) for t in ((64, 64, 32, 32, 32), (64, 64, 32, 32, 64), (128, 64, 64, 32, 32),
                                              (64, 128, 32, 64, 32), (128, 128, 64, 64, 32), (128, 128, 64, 32, 32),
                                              (128, 128, 64, 64, 64), (256, 128, 64, 64, 32))
                      for stages in (1, 2)) + ((128, 128, 64, 32, 64, 1), (128, 128, 32, 64, 64, 1),
                                               (64, 128, 32, 32, 32, 1), (128, 256, 64, 64, 32, 1),
                                               (128, 256, 64, 32, 32, 1), (128, 128, 32, 32, 32, 1))
X8_BLOCK_VALUES = 32
X8_BLOCK_BYTES = 48   # shaders/x8.glsl's block: 32 signed bytes and (d, two slice sums, 0) as f32, in planes
MAT_VEC_MAX_COLS = 8    # columns one mat-vec workgroup takes (llama.cpp's mat-vec path keeps 8 too)
# mul_mat_cols.comp (batched decode, "mat_cols"): the column counts it is built for (variants.toml
# `columns`); with Settings.batch_kernel "auto" (the default), products of 2 .. MAT_COLS_MAX
# columns take it on GPUs, but for those of up to 8 that the 8-bit mat-vec kernel takes (`product_path`).
# On an H200 (`vkllm bench kernels --cols`, the products of one Llama-8B pass) it took 25.6 ms at
# 16 columns where the tiles took 38.3; at 32 the tiles won (41.6 against 47.7). At 8 sequences
# a decode step took 23.3 ms through it, 17.1 through the 8-bit mat-vec kernel.
MAT_COLS_MAX = 16
# The mat-cols kernel over 8-bit x ("mat_cols_x8", variants.toml mul_mat_cols_*x8) takes batched
# decode of 2 .. MAT_COLS_X8_MAX columns of the types it is built for (`x8_cols_types`) on GPUs
# with integer dot products (`decode_x8`), in groups of 32 columns past 32. On the H200 a decode
# step of 64 sequences of the 8B (position 128) took 57.3 ms, 54.4 of it in the cooperative-matrix
# products, where 32 sequences' took 21.3 ms, 19.0 in products of this kernel. Where the
# cooperative-matrix kernel splits K (matrix units and float atomics: coopmat.py's coopmat_splits),
# products of more than MAT_COLS_X8_SPLIT_MAX columns take it instead: the H200 decoding 64
# sequences of the 8B, 2100.7 tok/s against 1806.5 through this kernel (at 32, 1348.8 against
# 1572.3 before coopmat.py's narrow tiles; at 32 columns those took 14336x4096 in 94 us where this
# kernel's fused gate+up took 208 for two, at 8 columns 76 us against 60 for two). Since the items
# kernel dequantizes in packed f16 the limit is 8: H100, 2026-12-07, 16 columns (us, mat-cols ->
# items) 14336x4096 gate+up 95.7 -> 85.5, 4096x14336 Q4_K 52.2 -> 56.1, Q6_K 100.2 -> 75.5,
# 6144x4096 Q/K/V 35.1 -> 31.7; at 8 mat-cols wins (gate+up 55.0 against 84.7). The 8B (bench
# --batch, same run): 12 sequences 1409.1 -> 1441.6 tok/s, 16 1875.6 -> 1917.1, 8 and 32 the same.
MAT_COLS_X8_MAX = 64
MAT_COLS_X8_SPLIT_MAX = 8
# The kernels over 8-bit activations in decode: their input is x quantized once (x8 scratch).
X8_PATHS = frozenset({"mat_vec_x8", "mat_cols_x8"})
# Types whose one-column products keep f32 x under decode_kernel "auto": MXFP4's 8-bit quants
# come from byte loads and a table per 16 values (dequant.glsl's quants16), where its f32 kernel
# has item loops. H200 (`vkllm bench kernels`, 2026-12-02, us): 4096x4096 64.0 over 8-bit x against
# 14.3 over f32, 14336x4096 210.2 against 35.6, 4096x14336 212.7 against 33.8, 128256x4096 1786
# against 263; H100 (2026-12-08, tuned shapes, its f32 kernel reading nibbles as f16) 14336x4096
# 210.4 against 27.9, 4096x14336 211.2 against 30.5. Dense products and gpt-oss's expert products
# alike (models/moe.py asks this rule).
F32_DECODE_TYPES = frozenset({T.MXFP4})


def coopmat_shape(info) -> tuple[int, int, int] | None:
    """The (TM, TN, TK) cooperative-matrix shape the mat-mat kernel takes on this device: one
    that divides the subgroup tile and the K step, 16x16x16 where offered (every vendor's f16
    shape), else the largest; None without cooperative matrices."""
    wm, wn, bk = (min(t[i] for t in COOPMAT_TILES) for i in (2, 3, 4))
    fitting = [s for s in info.coopmat_shapes if wm % s[0] == 0 and wn % s[1] == 0 and bk % s[2] == 0]
    if not fitting:
        return None
    return (16, 16, 16) if (16, 16, 16) in fitting else max(fitting, key=lambda s: s[0] * s[1] * s[2])


def coopmat_tile_runs(info, tile: tuple[int, ...]) -> bool:
    """Whether mul_mat_coopmat.comp runs with this (BM, BN, WM, WN, BK, stages) tile on the
    device: its subgroups within the workgroup size, and its shared memory (the f16 tiles, per
    stage, with 16 bytes of padding per row, and a TM x TN f32 staging tile per subgroup) within
    the device's."""
    tm, tn, _ = coopmat_shape(info)
    bm, bn, wm, wn, bk, stages = tile
    subgroups = (bm // wm) * (bn // wn)
    shared = stages * (bm + bn) * (bk + 8) * 2 + subgroups * tm * tn * 4
    return subgroups * info.subgroup_size <= info.max_workgroup_size and shared <= info.max_shared_memory


def paths(ctx) -> tuple[str, ...]:
    """The kernels a product can take on this device: "mat_vec" (groups of up to
    MAT_VEC_MAX_COLS columns), "mat_cols" (mul_mat_cols.comp, any number of columns, K a
    multiple of 16), "tiled" (mul_mat.comp), with VK_KHR_shader_integer_dot_product "mmq"
    (mul_mmq.comp: 8-bit activations, for the types of `mmq_types`; the others take the tiled
    kernel) and, with cooperative matrices, "coopmat" (mul_mat_coopmat.comp), which also needs
    a compiler for it (glslang >= 13)."""
    mmq = INTEGER_DOT in ctx.extensions and compilers.supported("integer_dot_product")
    coopmat = (COOPMAT in ctx.extensions and coopmat_shape(ctx.info) is not None
               and compilers.supported("cooperative_matrix"))
    return ("mat_vec", "mat_cols", "tiled") + (("mmq",) if mmq else ()) + (("coopmat",) if coopmat else ())


@cache
def mmq_types() -> frozenset:
    """The weight types the mmq kernel is built for (shaders/variants.toml's mul_mmq entry)."""
    return frozenset(t for t in T if f"mul_mmq_{t.name.lower()}" in shaderbuild.variants())


@cache
def x8_cols_types() -> frozenset:
    """The weight types the 8-bit mat-cols kernel is built for (variants.toml mul_mat_cols_x8)."""
    return frozenset(t for t in T if f"mul_mat_cols_x8_c2_{t.name.lower()}" in shaderbuild.variants())


def mat_mat_path(ctx) -> str:
    """The kernel of products past the mat-vec kernel's column groups (prefill):
    Settings.prefill_kernel where it names one (an error where the device lacks it); with
    "auto" cooperative matrices where offered, else 8-bit dot products where the device says
    they are accelerated (GPUs without matrix units: RDNA2, older NVIDIA and Intel), else the
    tiled kernel (lavapipe has the extension, unaccelerated; its CPU driver takes the mat-vec
    groups anyway, `product_path`)."""
    offered, choice = paths(ctx), ctx.settings.prefill_kernel
    if choice != "auto":
        if choice not in offered:
            raise VkllmError(f"VKLLM_PREFILL_KERNEL={choice}: {ctx.info.name} has no {choice} kernel "
                             f"(it offers {', '.join(p for p in offered if p not in ('mat_vec', 'mat_cols'))})")
        return choice
    if "coopmat" in offered:
        return "coopmat"
    return "mmq" if "mmq" in offered and ctx.info.int8_dot_accelerated else "tiled"


def decode_x8(ctx) -> bool:
    """Whether mat-vec products (decode: up to MAT_VEC_MAX_COLS columns) of the quantized types
    take the kernel over 8-bit activations (`mat_vec_x8`): Settings.decode_kernel "x8" (an error where the device
    lacks integer dot products), "mat_vec" never; with "auto" on GPUs that have them (on an H200
    it beat the f32 kernel for every type at every Llama-8B shape, 1.7x on the gate+up
    product, quantization of x included; `product_path` keeps F32_DECODE_TYPES on f32 x), not
    on CPU drivers (lavapipe has them unaccelerated)."""
    choice = ctx.settings.decode_kernel
    if choice == "x8" and "mmq" not in paths(ctx):
        raise VkllmError(f"VKLLM_DECODE_KERNEL=x8: {ctx.info.name} has no integer dot products")
    return choice == "x8" or (choice == "auto" and ctx.info.kind != "cpu" and "mmq" in paths(ctx))


def product_path(ctx, n: int, k: int = 0, folded: bool = False, qtype: T | None = None) -> str:
    """One column takes the mat-vec kernel, and so do products with a `folded` norm (only it
    applies one). 2 .. MAT_COLS_MAX columns over a K that is a multiple of 16 (`k`, 0: every K the
    caller has) take the mat-cols kernel on a GPU (Settings.batch_kernel "auto"; "mat_cols": on any
    device; "mat_vec": never), both reading the weights once for all columns; with "mat_mat" every
    product of 2 or more takes `mat_mat_path`'s kernel. Otherwise, on a CPU driver any number takes
    the mat-vec kernel (in groups), much faster there than tiles (unless Settings.prefill_kernel
    names a mat-mat kernel); on a GPU up to MAT_VEC_MAX_COLS do, more `mat_mat_path`'s kernel.
    Where `decode_x8` says so (then no norm folds into them) and batch_kernel is "auto", products
    of weights of `qtype` over a K that is a multiple of 256 take kernels over 8-bit x: 2 ..
    MAT_COLS_X8_MAX columns (.. MAT_COLS_X8_SPLIT_MAX where cooperative-matrix products split K,
    more `mat_mat_path`'s) of the types of `x8_cols_types` the mat-cols one, others of up to
    MAT_VEC_MAX_COLS columns of a type with an 8-bit mat-vec kernel (and K a multiple of 32) that
    one, but for F32_DECODE_TYPES unless decode_kernel is "x8" (so on a GPU with integer dot
    products: Q4_K, Q5_K and Q6_K 8-bit mat-cols up to 64 columns; other quantized types 8-bit
    mat-vec up to 8, f32 mat-cols 9 .. 16; MXFP4 the f32 kernels: mat-vec for one column, mat-cols
    for 2 .. 16)."""
    path = _f32_path(ctx, n, k, folded)
    auto = ctx.settings.batch_kernel == "auto"
    if folded or not decode_x8(ctx) or not (auto or path == "mat_vec"):
        return path
    if auto and n >= 2 and qtype in x8_cols_types() and k % 256 == 0:
        return "mat_cols_x8" if n <= _x8_cols_max(ctx) else mat_mat_path(ctx)
    if n <= MAT_VEC_MAX_COLS and qtype in mmq_types() and k % X8_BLOCK_VALUES == 0 \
            and not (qtype in F32_DECODE_TYPES and ctx.settings.decode_kernel == "auto"):
        return "mat_vec_x8"
    return path


def _x8_cols_max(ctx) -> int:
    split_k = "coopmat" in paths(ctx) and ctx.info.float_atomic_add
    return MAT_COLS_X8_SPLIT_MAX if split_k else MAT_COLS_X8_MAX


def may_take_mat_mat(ctx, n: int) -> bool:
    """Whether some product of n columns may take `mat_mat_path`'s kernel (`_f32_path`): past
    MAT_VEC_MAX_COLS, or from 2 with batch_kernel "mat_mat" (scratch for its inputs is sized so)."""
    return n > MAT_VEC_MAX_COLS or (n > 1 and ctx.settings.batch_kernel == "mat_mat")


def _f32_path(ctx, n: int, k: int, folded: bool) -> str:
    if n == 1 or folded:
        return "mat_vec"
    choice, cpu = ctx.settings.batch_kernel, ctx.info.kind == "cpu"
    if choice == "mat_mat":
        return mat_mat_path(ctx)
    if n <= MAT_COLS_MAX and k % 16 == 0 and (choice == "mat_cols" or (choice == "auto" and not cpu)):
        return "mat_cols"
    if n <= MAT_VEC_MAX_COLS or (cpu and ctx.settings.prefill_kernel == "auto"):
        return "mat_vec"
    return mat_mat_path(ctx)
