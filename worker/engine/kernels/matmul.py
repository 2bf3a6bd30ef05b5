"""Weight x activation products over DeviceTensors (embedding rows: embedding.py). Each function
records one dispatch per part of the weight, no barriers: the caller orders dependent work
(matmul_swiglu's unfused path records one barrier of its own, between its products and SwiGLU,
`normed_input` one after the norm it records when the products cannot fold it, and a split-K
cooperative-matrix product that overwrites y one after zeroing it).

An RMSNorm in front of products (`normed_input`) is folded into the mat-vec kernels where that
pays: they take the raw x and a `FoldedNorm` and normalise it on load; elsewhere (other inner
loops, the mat-mat kernels of prefill) the products take the norm kernel's output.

The "mmq" mat-mat kernel and the "mat_vec_x8" mat-vec kernel (decode, `decode_x8`) take 8-bit
activations (kernels/x8.py): their products quantize x into the scratch they are given (`x8`)
and record a barrier before the product, unless x is already `Quantized` (normed_input's norm
writes its output so for products that all take mat_vec_x8); the caller's barrier after a
product frees that scratch for the next. The cooperative-matrix ("coopmat") mat-mat kernel takes f16
activations, converted alike into the scratch `xh` (kernels/halves.py), once for the products
that share x, unless the dispatch before wrote them so (x is `Halves`: normed_input's norm,
matmul_swiglu's SwiGLU with halves_out)."""
from dataclasses import dataclass

from gguf import GGMLQuantizationType as T

from worker.engine.intmath import cdiv
from worker.engine.kernels import elementwise
from worker.engine.kernels.coopmat import coopmat_kernel, coopmat_splits, frag_kernel, frag_splits
from worker.engine.kernels.halves import VECTOR_VALUES, Halves, halves
from worker.engine.kernels.launch import grid
from worker.engine.kernels.norm import FoldedNorm, rms_norm, rms_norm_f16, rms_norm_x8
from worker.engine.kernels.mat_vec import (mat_vec_columns, mat_vec_kernel, mat_vec_name, mat_vec_shape,
                                           workgroup_rows)
from worker.engine.kernels.mat_cols import (MAT_COLS_X8_VARIANTS, X8_ITEM_VALUES, mat_cols_columns,
                                            mat_cols_shape, mat_cols_tile, mat_cols_x8_shape, x8_shape_runs)
from worker.engine.kernels.paths import X8_BLOCK_VALUES, X8_PATHS, coopmat_shape, mmq_types, product_path
from worker.engine.kernels.tensor import DeviceTensor
from worker.engine.kernels.x8 import Quantized, quantize_x8
from worker.engine.vk.commands import Recording
from worker.engine.vk.memory import Buffer

# Rows and columns of y per mul_mat.comp workgroup (its TILE), 4 x 4 per thread; 2 x TILE of the
# threads load weights, so TILE must be over 32 to leave some for loading x.
MAT_MAT_TILE = 64
MAT_MAT_THREADS = (MAT_MAT_TILE // 4) ** 2


def _mat_cols(rec: Recording, op: str, w: DeviceTensor, bindings: list[list[Buffer]], n: int, push: dict,
              mats: int, shape: tuple[int, ...] | None, x8: bool = False,
              outputs: list[tuple[Buffer, int]] | None = None):
    """One mul_mat_cols dispatch per part of w (bindings[i]: part i's buffers). Column groups are
    numbered fastest (mul_mat_vec_base.glsl with COLS). `x8`: the kernel over 8-bit x (op
    ends in _x8), whose shape has two more entries, the items per lane and tile and the ranges
    of K (past one: op's _split variant, one workgroup z per range, its `outputs` ((buffer,
    bytes); default: the last binding, n x w.rows) zeroed first unless it accumulates); without
    `shape` it takes the weight's tuned one for its column count (cols_tuning.py), else the default."""
    ctx = rec.ctx
    splits = 1
    if x8:
        cols = mat_cols_columns(n, MAT_COLS_X8_VARIANTS)
        shape = shape or w.cols_shapes.get((cols, mats == 2)) or mat_cols_x8_shape(ctx, cols, mats, w.ggml_type)
        threads, rows, row_lanes, tile, splits = shape
        fits = (x8_shape_runs(ctx, cols, shape, w.ggml_type) and w.cols % X8_ITEM_VALUES[w.ggml_type] == 0
                and (splits == 1 or mats == 1))
    else:
        cols = mat_cols_columns(n)
        threads, rows, row_lanes = shape = shape or mat_cols_shape(ctx, cols, mats)
        tile = mat_cols_tile(ctx, cols, shape)
        fits = tile is not None
    if not fits:
        raise ValueError(f"mat-cols workgroup {shape} does not fit {cols} columns of {w.cols} on {ctx.info.name}")
    _zero_for_ranges(rec, splits, push, outputs or [(bindings[0][-1], 4 * n * w.rows)])
    kernel = ctx.kernel(f"{op}{'_split' if splits > 1 else ''}_c{cols}_{w.ggml_type.name.lower()}",
                        {0: threads, 1: rows, 3: tile, 4: row_lanes})
    lanes = ctx.info.subgroup_size
    rows_per_group = rows * (threads // lanes) * (lanes // row_lanes)
    for buffers, (_, first, count) in zip(bindings, w.parts):
        x_groups, y_groups, _ = grid(ctx, cdiv(count, rows_per_group) * cdiv(n, cols))
        rec.dispatch(kernel, buffers, (x_groups, y_groups, splits), push | dict(rows=count, y_offset=first))


def _zero_for_ranges(rec: Recording, splits: int, push: dict, outputs: list[tuple[Buffer, int]]):
    """A product split over ranges of K (splits > 1) that overwrites its outputs ((buffer,
    bytes)) has them zeroed first, then a barrier: the ranges add to zeros."""
    if splits > 1 and not push["accumulate"]:
        for y, nbytes in outputs:
            rec.fill(y, nbytes)
        rec.barrier()


def _push(w: DeviceTensor, first: int, count: int, n: int, accumulate: bool, norm: FoldedNorm | None = None,
          eps: float | None = None) -> dict:
    """The push constants of the product kernels (one block, shaders/mul_mat_push.glsl; the
    mat-vec kernels that fold a norm, or scale by one (`eps`: the _rms variants), add its eps)."""
    push = dict(ncols=w.cols, rows=count, n=n, y_offset=first, y_stride=w.rows, accumulate=int(accumulate))
    eps = norm.eps if norm is not None else eps
    return push if eps is None else push | dict(eps=float(eps))


def _norm_suffix(norm: FoldedNorm | None) -> str:
    return "" if norm is None else "_norm"


def _norm_buffers(norm: FoldedNorm | None) -> list[Buffer]:
    return [] if norm is None else [norm.weight]


# The types whose mat-vec takes mul_mat_vec_items.glsl's loops (mul_mat_vec_base.glsl's
# MAT_VEC_ITEMS; in the fused gate+up kernel MXFP4 only). A folded norm costs those loops little
# (H200, 8B: Q/K/V as one 6144x4096 Q4_K product 17.2 -> 17.6 us) and the 16-value loops of the
# others much more (the Q6_K output head 264 -> 300 us, Q4_K gate+up 52 -> 78 us) than the norm
# kernel's 5 us: those take its output.
ITEM_LOOP_TYPES = frozenset({T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.MXFP4})
GLU_ITEM_LOOP_TYPES = frozenset({T.MXFP4})


@dataclass(frozen=True)
class NormBlocks:
    """What a residual product (x += W input, where `folds_norm` says it can) writes besides x:
    the next RMSNorm's input (x times `weight`, with each block's sum of x^2) in 8-bit blocks into
    x8, each block by the last of its workgroups (`done`: counters as BlocksOut's). The products
    of that norm take Quantized(x8, eps)."""
    x8: Buffer
    done: Buffer
    weight: Buffer
    eps: float


@dataclass(frozen=True)
class BlocksOut:
    """What a fused gate+up product (`matmul_swiglu`, where `writes_blocks` says it can) writes
    besides its f32 output: that output in 8-bit blocks into x8, the down product's input, each
    block by the last of its workgroups (`done`: counters of a zeroed buffer, one per block, left at 0)."""
    x8: Buffer
    done: Buffer


def _tiles_blocks(w: DeviceTensor, shape: tuple[int, int, int], n: int) -> bool:
    """Whether the last workgroup of each 32-row block of a mat-vec product (workgroups of `shape`)
    can write that block (BlocksOut, NormBlocks): one column, one part, rows of whole blocks that
    the workgroups tile (a divisor of a block each) or hold (whole blocks each)."""
    rows = workgroup_rows(shape)
    return (n == 1 and len(w.parts) == 1 and w.rows % X8_BLOCK_VALUES == 0
            and (X8_BLOCK_VALUES % rows == 0 or rows % X8_BLOCK_VALUES == 0))


def writes_blocks(ctx, w_gate: DeviceTensor, w_up: DeviceTensor, n: int, path: str | None = None) -> bool:
    """Whether matmul_swiglu of these weights over n columns can take a BlocksOut: one column,
    one part each of one type, through the fused 8-bit mat-vec kernel whose workgroups' rows
    tile the 32-row blocks."""
    return (_tiles_blocks(w_gate, w_gate.glu_shape or mat_vec_shape(ctx), n) and len(w_up.parts) == 1
            and w_gate.ggml_type == w_up.ggml_type
            and (path or product_path(ctx, 1, w_gate.cols, qtype=w_gate.ggml_type)) == "mat_vec_x8")


def folds_norm(ctx, residual: DeviceTensor, consumers: list[DeviceTensor], n: int) -> bool:
    """Whether the residual product of `residual` over n columns can write the next RMSNorm's
    input for the products of `consumers` (NormBlocks): one column, one part of rows of a multiple
    of 32 whose workgroups tile the 32-row blocks, and it and all the consumers through the 8-bit
    mat-vec kernel."""
    return (_tiles_blocks(residual, residual.mat_vec_shape or mat_vec_shape(ctx), n)
            and all(product_path(ctx, 1, w.cols, qtype=w.ggml_type) == "mat_vec_x8" for w in [residual, *consumers]))


def normed_input(rec: Recording, x: Buffer, weight: Buffer, scratch: Buffer, n: int, cols: int, eps: float,
                 consumers: list[DeviceTensor], glu: bool = False, x8: Buffer | None = None,
                 xh: Buffer | None = None) -> tuple[Buffer | Quantized | Halves, FoldedNorm | None]:
    """The input of the products of rms_norm(x) * weight over n rows of cols by the `consumers`
    (through the fused gate+up kernel: `glu`): where they all take the mat-vec kernel (matmul's
    rule) with item loops, x itself and the norm for them to fold (no dispatch); where they all
    take the 8-bit one, the norm quantized into `x8` in the same dispatch; where they all take
    the cooperative-matrix one (and rows need no padding), the norm in f16 into `xh` likewise;
    otherwise the norm is recorded into `scratch`; any of the last three then a barrier."""
    folding = GLU_ITEM_LOOP_TYPES if glu else ITEM_LOOP_TYPES
    taken = {product_path(rec.ctx, n, w.cols, qtype=w.ggml_type) for w in consumers}
    if taken == {"mat_vec"} and all(w.ggml_type in folding for w in consumers):
        return x, FoldedNorm(weight, eps)
    if taken <= X8_PATHS:
        rms_norm_x8(rec, x, weight, x8, n, cols, eps)
        rec.barrier()
        return Quantized(x8), None
    if taken == {"coopmat"} and xh is not None and cols % VECTOR_VALUES == 0:
        rms_norm_f16(rec, x, weight, xh, n, cols, eps)
        rec.barrier()
        return Halves(xh), None
    rms_norm(rec, x, weight, scratch, n, cols, eps)
    rec.barrier()
    return scratch, None


def matmul(rec: Recording, w: DeviceTensor, x: Buffer, y: Buffer, n: int, y_accumulate: bool = False,
           path: str | None = None, norm: FoldedNorm | None = None,
           cols_shape: tuple[int, ...] | None = None, x8: Buffer | None = None,
           next_norm: NormBlocks | None = None, xh: Buffer | None = None):
    """y[t, r] (+)= sum_k W[r, k] * x[t, k]; x f32 [n, w.cols], y f32 [n, w.rows], through the
    kernel `product_path` picks for the device and n (decode: mat-vec, batched decode: mat-cols;
    prefill: mat-mat), or the one of `paths(ctx)` given (tests check each on every device). The
    mat-vec workgroup shape is the weight's tuned one, else the device kind's fixed one; the
    mat-cols one `cols_shape` (as mat_cols_shape gives it), else `mat_cols_shape`'s. The
    cooperative-matrix kernel rounds weights and activations to f16 (accumulating in f32), the
    mmq and mat_vec_x8 kernels quantize the activations to 8 bits per block of 32 into `x8` first,
    the cooperative-matrix one converts them to f16 into `xh` (unless x is Halves already).
    `norm` (mat-vec only): the products are of rms_norm(x[t]) * norm.weight. `next_norm` (a
    residual product, where `folds_norm`): the next norm's input in 8-bit blocks too."""
    ctx = rec.ctx
    path = path or product_path(ctx, n, w.cols, norm is not None, w.ggml_type)
    if next_norm is not None:
        if not (y_accumulate and path == "mat_vec_x8" and _rms_eps(x) is None and folds_norm(ctx, w, [], n)):
            raise ValueError("only a one-column, one-part residual product of the 8-bit mat-vec kernel over "
                             "normalised input writes the next norm's blocks")
        _mat_vec(rec, w, "mul_mat_vec_x8_rms_blocks", _quantized_x(rec, x, x8, n, w.cols, norm), y, n, True,
                 tail=[next_norm.x8, next_norm.done, next_norm.weight])
        return
    if path == "mmq":
        if norm is not None:
            raise ValueError("the mat-mat kernels take normalised input: a norm folds into mat-vec products only")
        _mmq_products(rec, [(w, y)], x, n, x8, y_accumulate)
        return
    if path == "mat_cols":
        if norm is not None:
            raise ValueError("the mat-cols kernel takes normalised input: a norm folds into mat-vec products only")
        if w.cols % 16:
            raise ValueError(f"the mat-cols kernel takes rows of a multiple of 16 values, not {w.cols}")
        _mat_cols(rec, "mul_mat_cols", w, [[part, x, y] for part, _, _ in w.parts], n,
                  _push(w, 0, 0, n, y_accumulate), 1, cols_shape)
        return
    if path == "mat_vec_x8":
        _mat_vec(rec, w, "mul_mat_vec_x8", _quantized_x(rec, x, x8, n, w.cols, norm, True), y, n, y_accumulate,
                 eps=_rms_eps(x))
        return
    if path == "mat_cols_x8":
        xq = _quantized_x(rec, x, x8, n, w.cols, norm)
        _mat_cols(rec, "mul_mat_cols_x8", w, [[part, xq, y] for part, _, _ in w.parts], n,
                  _push(w, 0, 0, n, y_accumulate), 1, cols_shape, x8=True)
        return
    if path == "mat_vec":
        _mat_vec(rec, w, f"mul_mat_vec{_norm_suffix(norm)}", x, y, n, y_accumulate, norm)
        return
    if norm is not None:
        raise ValueError("the mat-mat kernels take normalised input: a norm folds into mat-vec products only")
    _mat_mat(rec, w, path, "", [x, y], n, _push(w, 0, 0, n, y_accumulate), xh=xh)


def _mat_mat(rec: Recording, w: DeviceTensor, path: str, variant: str, buffers: list[Buffer], n: int, push: dict,
             outputs: list[tuple[Buffer, int]] | None = None, xh: Buffer | None = None):
    """w times x over n columns through the tiled ("tiled", mul_mat<variant>_<type>) or the
    cooperative-matrix ("coopmat", mul_mat_coopmat<variant>_<type>; coopmat.py's tile) kernel,
    one dispatch per part; `buffers`: x and the outputs, `push` as _push gives it (each part's
    rows and offset filled in here). A cooperative-matrix product of few tiles splits K
    (`coopmat_splits`), its `outputs` ((buffer, bytes); default: the last buffer, n x w.rows)
    zeroed first unless it accumulates; its x (buffers[0]) in f16 (`halves`, into `xh`)."""
    ctx, type_name = rec.ctx, w.ggml_type.name.lower()
    if path == "coopmat":
        buffers = [halves(rec, buffers[0], xh, n, w.cols), *buffers[1:]]
        frag = frag_kernel(ctx, w.ggml_type, n)
        if frag is None:
            (bm, bn, wm, wn, bk, stages), ahead = coopmat_kernel(ctx.info, w, n)
            kind, splits = "_items" if ahead else "", coopmat_splits(ctx, w, n, (bm, bn, bk), ahead)
        else:   # mul_mat_coopmat_frag.comp takes the same constants (steps ahead unused)
            (bm, bn, wm, wn, bk, stages), ahead, kind = frag, 0, "_frag"
            splits = frag_splits(ctx, w, n, frag)
        tm, tn, tk = coopmat_shape(ctx.info)
        subgroup = ctx.info.subgroup_size
        threads = (bm // wm) * (bn // wn) * subgroup
        _zero_for_ranges(rec, splits, push, outputs or [(buffers[-1], 4 * n * w.rows)])
        name = f"mul_mat_coopmat{variant}{kind}{'_split' if splits > 1 else ''}_{type_name}"
        kernel = ctx.kernel(name, {0: threads, 1: bm, 2: bn, 3: wm, 4: wn, 5: tm, 6: tn, 7: tk, 8: subgroup, 9: bk,
                                   10: stages, 11: max(ahead, 1)})
    else:
        if isinstance(buffers[0], Halves):
            raise ValueError("only the cooperative-matrix kernel takes f16 activations")
        bm = bn = MAT_MAT_TILE
        splits = 1
        kernel = ctx.kernel(f"mul_mat{variant}_{type_name}", {0: MAT_MAT_THREADS, 1: MAT_MAT_TILE})
    for buffer, first, count in w.parts:
        rec.dispatch(kernel, [buffer, *buffers], (cdiv(count, bm), cdiv(n, bn), splits),
                     push | dict(rows=count, y_offset=first))


def _rms_eps(x) -> float | None:
    """The eps of an RMSNorm whose input x holds unscaled (Quantized with an eps), else None."""
    return x.eps if isinstance(x, Quantized) else None


def _quantized_x(rec: Recording, x: Buffer, x8: Buffer | None, n: int, k: int, norm: FoldedNorm | None,
                 scaled: bool = False) -> Buffer:
    """x8 = x in 8-bit blocks (quantize_x8), then a barrier: the input of mat_vec_x8 products
    (x already Quantized: its blocks as they are; unscaled ones only for products that scale them,
    `scaled`)."""
    if isinstance(x, Quantized):
        if x.eps is not None and not scaled:
            raise ValueError("only one-column 8-bit mat-vec products take an RMSNorm's input unscaled")
        return x.x8
    if norm is not None:
        raise ValueError("the 8-bit mat-vec kernel takes normalised input: a norm folds into f32 mat-vec products only")
    quantize_x8(rec, x, x8, n, k)
    rec.barrier()
    return x8


def _mat_vec(rec: Recording, w: DeviceTensor, op: str, x: Buffer, y: Buffer, n: int, accumulate: bool,
             norm: FoldedNorm | None = None, tail: list[Buffer] = (), eps: float | None = None):
    """y (+)= w x through mat-vec kernel `op`_<type> (mul_mat_vec, its norm-folding or 8-bit
    variant: x then holds 8-bit blocks): the weight's tuned workgroup shape, else the device
    kind's; one dispatch per part. `tail`: the kernel's bindings after y (a folded norm's weight
    otherwise); `eps`: x is an RMSNorm's input unscaled (Quantized with an eps): op's _rms variant."""
    shape = w.mat_vec_shape or mat_vec_shape(rec.ctx)
    cols = mat_vec_columns(rec.ctx, n, shape, norm is not None or eps is not None)
    kernel = mat_vec_kernel(rec.ctx, mat_vec_name(op if eps is None else f"{op}_rms", w.ggml_type, cols), shape, cols)
    for buffer, first, count in w.parts:
        x_groups, y_groups, _ = grid(rec.ctx, cdiv(count, workgroup_rows(shape)))
        rec.dispatch(kernel, [buffer, x, y, *(tail or _norm_buffers(norm))], (x_groups, y_groups, cdiv(n, cols)),
                     _push(w, first, count, n, accumulate, norm, eps))


def _mmq_products(rec: Recording, products: list[tuple[DeviceTensor, Buffer]], x: Buffer, n: int,
                  x8: Buffer | None, accumulate: bool = False):
    """y (+)= w x for each (w, y) of `products` (weights of one K) on the mmq path: x quantized
    once for all of them into x8 (then a barrier); a weight of a type without an mmq kernel
    takes the tiled one."""
    ctx, types = rec.ctx, mmq_types()
    quantized = [w for w, _ in products if w.ggml_type in types]
    if quantized:
        quantize_x8(rec, x, x8, n, quantized[0].cols)
        rec.barrier()
    for w, y in products:
        if w.ggml_type not in types:
            matmul(rec, w, x, y, n, accumulate, path="tiled")
            continue
        kernel = ctx.kernel(f"mul_mmq_{w.ggml_type.name.lower()}", {0: MAT_MAT_THREADS, 1: MAT_MAT_TILE})
        for buffer, first, count in w.parts:
            rec.dispatch(kernel, [buffer, x8, y], (cdiv(count, MAT_MAT_TILE), cdiv(n, MAT_MAT_TILE), 1),
                         _push(w, first, count, n, accumulate))


def matmul_qkv(rec: Recording, fused: DeviceTensor | None, weights: list[DeviceTensor], x: Buffer,
               outs: list[Buffer], n: int, norm: FoldedNorm | None = None, path: str | None = None,
               x8: Buffer | None = None, xh: Buffer | None = None):
    """outs[i] = weights[i] x for the Q, K and V projections (matmul for each). `fused`: the
    weights of its `sections` (Q and K, or all three; tensor.upload_rows) as one tensor, which
    the mat-vec and mat-cols kernels take in one dispatch writing each section's rows to its output; the
    weights it lacks take their own products, and all of them on the mmq path (over x quantized
    once into `x8`; on the cooperative-matrix path over x converted once into `xh`)."""
    rest = list(zip(weights, outs))
    path = path or product_path(rec.ctx, n, weights[0].cols, norm is not None, (fused or weights[0]).ggml_type)
    if path in X8_PATHS:   # x quantized once for all the products; types without the kernel take f32 x
        xq = _quantized_x(rec, x, x8, n, weights[0].cols, norm, path == "mat_vec_x8")
        if fused is not None:
            if path == "mat_vec_x8":
                _mat_vec_qkv(rec, fused, "mul_mat_vec_qkv_x8", xq, outs, n, None, _rms_eps(x))
            else:
                _mat_cols_qkv(rec, fused, "mul_mat_cols_qkv_x8", xq, outs, n, x8=True)
            rest = rest[len(fused.sections):]
        for w, y in rest:
            own = product_path(rec.ctx, n, w.cols, qtype=w.ggml_type)
            matmul(rec, w, Quantized(xq, _rms_eps(x)) if own in X8_PATHS else x, y, n, path=own)
        return
    if path == "coopmat" and norm is None:
        x = Halves(halves(rec, x, xh, n, weights[0].cols))
    if fused is not None and path == "mat_cols" and norm is None:
        _mat_cols_qkv(rec, fused, "mul_mat_cols_qkv", x, outs, n)
        rest = rest[len(fused.sections):]
    elif fused is not None and path == "mat_vec":
        _mat_vec_qkv(rec, fused, f"mul_mat_vec_qkv{_norm_suffix(norm)}", x, outs, n, norm)
        rest = rest[len(fused.sections):]
    elif fused is not None and path in ("tiled", "coopmat") and norm is None:
        k_first, v_first = fused.sections[0], sum(fused.sections[:2])
        y_v = outs[2] if len(fused.sections) == 3 else outs[1]   # as _mat_vec_qkv's
        _mat_mat(rec, fused, path, "_qkv", [x, outs[0], outs[1], y_v], n,
                 _push(fused, 0, 0, n, False) | dict(k_first=k_first, v_first=v_first),
                 [(y, 4 * n * rows) for y, rows in zip(outs, fused.sections)])
        rest = rest[len(fused.sections):]
    if path == "mmq" and norm is None:
        _mmq_products(rec, rest, x, n, x8)
        return
    for w, y in rest:
        matmul(rec, w, x, y, n, norm=norm, path=path)


def _mat_cols_qkv(rec: Recording, fused: DeviceTensor, op: str, x: Buffer, outs: list[Buffer], n: int,
                  x8: bool = False):
    """The fused Q/K/V weight in one mat-cols dispatch per part (kernel `op`; `x8`: over 8-bit
    x), writing each section's rows to its output."""
    k_first, v_first = fused.sections[0], sum(fused.sections[:2])
    y_v = outs[2] if len(fused.sections) == 3 else outs[1]   # as _mat_vec_qkv's
    _mat_cols(rec, op, fused, [[part, x, outs[0], outs[1], y_v] for part, _, _ in fused.parts], n,
              _push(fused, 0, 0, n, False) | dict(k_first=k_first, v_first=v_first), 1, None, x8,
              [(y, 4 * n * rows) for y, rows in zip(outs, fused.sections)])


def _mat_vec_qkv(rec: Recording, fused: DeviceTensor, op: str, x: Buffer, outs: list[Buffer], n: int,
                 norm: FoldedNorm | None, eps: float | None = None):
    """The fused Q/K/V weight in one mat-vec dispatch per part (kernel `op`_<type>) writing each
    section's rows to its output (`eps`: as _mat_vec's)."""
    ctx, members = rec.ctx, len(fused.sections)
    shape = fused.mat_vec_shape or mat_vec_shape(ctx)
    cols = mat_vec_columns(ctx, n, shape, norm is not None or eps is not None)
    kernel = mat_vec_kernel(ctx, mat_vec_name(op if eps is None else f"{op}_rms", fused.ggml_type, cols), shape, cols)
    k_first, v_first = fused.sections[0], sum(fused.sections[:2])
    y_q, y_k = outs[0], outs[1]
    y_v = outs[2] if members == 3 else outs[1]   # bound, never written: no row is past v_first
    for buffer, first, count in fused.parts:
        x_groups, y_groups, _ = grid(ctx, cdiv(count, workgroup_rows(shape)))
        rec.dispatch(kernel, [buffer, x, y_q, y_k, y_v, *_norm_buffers(norm)], (x_groups, y_groups, cdiv(n, cols)),
                     _push(fused, first, count, n, False, norm, eps) | dict(k_first=k_first, v_first=v_first))


def matmul_swiglu(rec: Recording, w_gate: DeviceTensor, w_up: DeviceTensor, x: Buffer, out: Buffer, n: int,
                  up: Buffer, gelu: bool = False, norm: FoldedNorm | None = None, path: str | None = None,
                  cols_shape: tuple[int, ...] | None = None, x8: Buffer | None = None,
                  blocks_out: BlocksOut | None = None, xh: Buffer | None = None,
                  halves_out: bool = False) -> Halves | None:
    """out[t, r] = silu(W_gate x[t])[r] * (W_up x[t])[r]; x f32 [n, cols], out f32 [n, rows]: the
    gate and up products of a feed-forward block and its SwiGLU (with `gelu`, GeGLU: GELU's tanh
    form in place of silu). Where the mat-vec kernel would
    take both products (matmul's rule), one dispatch per part does all three, reading x once for
    both weights: that needs both weights of one type with the same row parts, and the
    workgroup's partial sums (two per row and column) within shared memory. Otherwise two matmul
    calls write out and `up` (f32 [n, rows], scratch used only then), a barrier, elementwise
    swiglu into out. Either way the caller orders only x before and out after, as for matmul.
    `norm`: as matmul's, for both products. Where the mat-cols kernel takes them (matmul's rule,
    or `path`), its fused variant does the same (`cols_shape` as matmul's). On the mmq path both
    products take x quantized once into `x8`, on the cooperative-matrix path x converted once
    into `xh`. `blocks_out` (SwiGLU, where `writes_blocks`): the
    output in 8-bit blocks too (BlocksOut). `halves_out` (the next product takes the
    cooperative-matrix kernel): where the SwiGLU is a dispatch of its own and rows need no
    padding, its output goes in f16 into `xh` instead of out (x's f16 copy is read by then),
    and that is returned as Halves; otherwise None."""
    if (w_gate.rows, w_gate.cols) != (w_up.rows, w_up.cols):
        raise ValueError(f"gate {w_gate.rows}x{w_gate.cols} and up {w_up.rows}x{w_up.cols} differ in shape")
    ctx = rec.ctx
    if blocks_out is not None and (gelu or norm is not None or not writes_blocks(ctx, w_gate, w_up, n, path)):
        raise ValueError("only a one-column, one-part SwiGLU of the fused 8-bit mat-vec kernel writes its "
                         "output in 8-bit blocks")
    path = path or product_path(ctx, n, w_gate.cols, norm is not None, w_gate.ggml_type)
    same_parts = [p[1:] for p in w_gate.parts] == [p[1:] for p in w_up.parts]
    if path == "mat_cols" and norm is None and w_gate.ggml_type == w_up.ggml_type and same_parts:
        bindings = [[gate, up_part, x, out] for (gate, _, _), (up_part, _, _) in zip(w_gate.parts, w_up.parts)]
        _mat_cols(rec, f"mul_mat_cols_{'geglu' if gelu else 'glu'}", w_gate, bindings, n,
                  _push(w_gate, 0, 0, n, False), 2, cols_shape)
        return
    if path == "mat_cols_x8" and w_gate.ggml_type == w_up.ggml_type and same_parts:
        xq = _quantized_x(rec, x, x8, n, w_gate.cols, norm)
        bindings = [[gate, up_part, xq, out] for (gate, _, _), (up_part, _, _) in zip(w_gate.parts, w_up.parts)]
        _mat_cols(rec, f"mul_mat_cols_{'geglu' if gelu else 'glu'}_x8", w_gate, bindings, n,
                  _push(w_gate, 0, 0, n, False), 2, cols_shape, x8=True)
        return
    shape = w_gate.glu_shape or mat_vec_shape(ctx)
    eps = _rms_eps(x)
    cols = mat_vec_columns(ctx, n, shape, norm is not None or eps is not None, mats=2)
    if path not in ("mat_vec", "mat_vec_x8") or w_gate.ggml_type != w_up.ggml_type or not same_parts or cols == 0:
        if blocks_out is not None:
            raise ValueError(f"the fused gate+up kernel's partial sums of {shape[0]} threads exceed shared memory")
        if path == "mmq" and norm is None:
            _mmq_products(rec, [(w_gate, out), (w_up, up)], x, n, x8)
        else:   # on the x8 paths each product takes its own kernel's path (the up weight's type may lack it)
            if path == "coopmat" and norm is None:
                x = Halves(halves(rec, x, xh, n, w_gate.cols))
            matmul(rec, w_gate, x, out, n, norm=norm, path=None if path in X8_PATHS else path,
                   cols_shape=cols_shape, x8=x8)
            if path in X8_PATHS:
                rec.barrier()   # both products quantize x into x8
            matmul(rec, w_up, x, up, n, norm=norm, path=None if path in X8_PATHS else path,
                   cols_shape=cols_shape, x8=x8)
        rec.barrier()
        f16 = halves_out and xh is not None and w_gate.rows % VECTOR_VALUES == 0
        (elementwise.geglu if gelu else elementwise.swiglu)(rec, out, up, xh if f16 else out, n * w_gate.rows, f16)
        return Halves(xh) if f16 else None
    op = "geglu" if gelu else "glu"
    rms = "" if eps is None else "_rms"
    variant = ("_x8_blocks" if blocks_out is not None else "_x8") + rms if path == "mat_vec_x8" \
        else _norm_suffix(norm)
    if path == "mat_vec_x8":
        x = _quantized_x(rec, x, x8, n, w_gate.cols, norm, True)
    kernel = mat_vec_kernel(ctx, mat_vec_name(f"mul_mat_vec_{op}{variant}", w_gate.ggml_type, cols), shape, cols)
    tail = _norm_buffers(norm) if blocks_out is None else [blocks_out.x8, blocks_out.done]
    for (gate, first, count), (up_part, _, _) in zip(w_gate.parts, w_up.parts):
        x_groups, y_groups, _ = grid(ctx, cdiv(count, workgroup_rows(shape)))
        rec.dispatch(kernel, [gate, up_part, x, out, *tail], (x_groups, y_groups, cdiv(n, cols)),
                     _push(w_gate, first, count, n, False, norm, eps))
