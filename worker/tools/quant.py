"""Quantize float32 rows into GGUF block bytes, so the synthetic model generator can write every
weight type the engine reads.

The legacy types, BF16 and MXFP4 reuse the `gguf` package's block quantizers; the package only
dequantizes k-quants, so those are written here. They are simple (scales from the block's
range, rounded up so values are not clipped) rather than llama.cpp's error-minimising search:
good enough for random test weights, and fully vectorised so an 8B-shaped model quantizes in
minutes. The block layouts follow ggml-common.h; gguf.quants.dequantize is the check.
"""
import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

QK_K = 256


def quantize(rows: np.ndarray, qtype: T) -> np.ndarray:
    """(n_rows, K) float -> (n_rows, bytes_per_row) uint8 in `qtype`'s GGUF block layout."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    n_rows, k = rows.shape
    block, type_size = GGML_QUANT_SIZES[qtype]
    if k % block:
        raise ValueError(f"row length {k} is not a multiple of {qtype.name}'s block size {block}")
    blocks = QUANTIZERS[qtype](rows.reshape(-1, block))
    return blocks.reshape(n_rows, k // block * type_size)


def _f16(x: np.ndarray) -> np.ndarray:
    """Round to float16 and back, so later maths uses the scale the file will hold."""
    return x.astype(np.float16).astype(np.float32)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b > 0, a / np.where(b > 0, b, 1), 0).astype(np.float32)


def _affine(x: np.ndarray, qmax: int, smax: int):
    """Scales for y = d*sc*q - dmin*m over sub-blocks x: (n_blocks, n_sub, sub_len).

    Returns (d, dmin, sc, m, q) with d, dmin float32 (n_blocks,), sc, m, q integers."""
    lo = np.minimum(x.min(-1), 0)
    min_f = -lo
    dmin = _f16(min_f.max(-1) / smax)
    m = np.clip(np.ceil(_safe_div(min_f, dmin[:, None])), 0, smax)
    dm = dmin[:, None] * m
    need = np.maximum(x.max(-1) + dm, 0) / qmax
    d = _f16(need.max(-1) / smax)
    sc = np.clip(np.ceil(_safe_div(need, d[:, None])), 0, smax)
    ds = d[:, None] * sc
    q = np.clip(np.rint(_safe_div(x + dm[..., None], ds[..., None])), 0, qmax)
    return d, dmin, sc.astype(np.uint8), m.astype(np.uint8), q.astype(np.uint8)


def _symmetric(x: np.ndarray, nmin: int, smax: int):
    """Scales for y = d*sc*q, q in [-nmin, nmin-1], signed sub-block scales in [-smax-1, smax].

    The value of largest magnitude in each sub-block maps to -nmin (as llama.cpp does), which
    uses the whole asymmetric integer range."""
    idx = np.abs(x).argmax(-1)[..., None]
    scale_f = np.take_along_axis(x, idx, -1)[..., 0] / -nmin
    d = _f16(np.abs(scale_f).max(-1) / smax)
    sc = np.clip(np.rint(_safe_div(scale_f, d[:, None])), -smax - 1, smax)
    ds = d[:, None] * sc
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(ds[..., None] != 0, x / np.where(ds == 0, 1, ds)[..., None], 0)
    q = np.clip(np.rint(q), -nmin, nmin - 1)
    return d, sc.astype(np.int8), q.astype(np.int8)


def _pack_bits(q: np.ndarray, groups: int, width: int) -> np.ndarray:
    """Pack (n, groups*k*L) codes of `width` bits: code (g, s, l) goes to byte g*L + l at shift
    s*width, where k = 8 // width fields share a byte (the k-quant interleave)."""
    n = q.shape[0]
    per = 8 // width
    q = q.reshape(n, groups, per, -1).astype(np.uint8)
    shifts = (np.arange(per, dtype=np.uint8) * width).reshape(1, 1, per, 1)
    return np.bitwise_or.reduce(q << shifts, axis=2).reshape(n, -1)


def _f16_bytes(d: np.ndarray) -> np.ndarray:
    return d.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _pack_scales_6bit(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The 12-byte scale/min packing of Q4_K and Q5_K (get_scale_min_k4 in ggml)."""
    lo_sc, hi_sc = sc[:, :4], sc[:, 4:]
    lo_m, hi_m = m[:, :4], m[:, 4:]
    b0 = (lo_sc & 0x3F) | ((hi_sc >> 4) << 6)
    b1 = (lo_m & 0x3F) | ((hi_m >> 4) << 6)
    b2 = (hi_sc & 0x0F) | ((hi_m & 0x0F) << 4)
    return np.concatenate([b0, b1, b2], axis=1).astype(np.uint8)


def _q2_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = _affine(blocks.reshape(-1, 16, 16), qmax=3, smax=15)
    scales = sc | (m << 4)
    return np.concatenate([scales, _pack_bits(q, 2, 2), _f16_bytes(d), _f16_bytes(dmin)], axis=1)


def _q3_k(blocks: np.ndarray) -> np.ndarray:
    d, sc, q = _symmetric(blocks.reshape(-1, 16, 16), nmin=4, smax=31)
    u = (q.astype(np.int16) + 4).astype(np.uint8).reshape(len(blocks), -1)
    hmask = _pack_bits(u >> 2, 1, 1)
    qs = _pack_bits(u & 3, 2, 2)
    s6 = (sc.astype(np.int16) + 32).astype(np.uint8)
    low = (s6[:, :8] & 0x0F) | ((s6[:, 8:] & 0x0F) << 4)
    high = _pack_bits(s6 >> 4, 1, 2)
    return np.concatenate([hmask, qs, low, high, _f16_bytes(d)], axis=1)


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = _affine(blocks.reshape(-1, 8, 32), qmax=15, smax=63)
    qs = _pack_bits(q, 4, 4)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_scales_6bit(sc, m), qs], axis=1)


def _q5_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = _affine(blocks.reshape(-1, 8, 32), qmax=31, smax=63)
    q = q.reshape(len(blocks), -1)
    qh = _pack_bits(q >> 4, 1, 1)
    qs = _pack_bits(q & 15, 4, 4)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _pack_scales_6bit(sc, m), qh, qs], axis=1)


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    d, sc, q = _symmetric(blocks.reshape(-1, 16, 16), nmin=32, smax=127)
    u = (q.astype(np.int16) + 32).astype(np.uint8).reshape(len(blocks), -1)
    ql = _pack_bits(u & 15, 2, 4)
    qh = _pack_bits(u >> 4, 2, 2)
    return np.concatenate([ql, qh, sc.view(np.uint8), _f16_bytes(d)], axis=1)


def _plain(dtype):
    return lambda blocks: blocks.astype(dtype).view(np.uint8)


QUANTIZERS = {
    T.F32: _plain(np.float32),
    T.F16: _plain(np.float16),
    T.BF16: gq.BF16.quantize_blocks,
    T.Q4_0: gq.Q4_0.quantize_blocks,
    T.Q4_1: gq.Q4_1.quantize_blocks,
    T.Q5_0: gq.Q5_0.quantize_blocks,
    T.Q5_1: gq.Q5_1.quantize_blocks,
    T.Q8_0: gq.Q8_0.quantize_blocks,
    T.MXFP4: gq.MXFP4.quantize_blocks,
    T.Q2_K: _q2_k,
    T.Q3_K: _q3_k,
    T.Q4_K: _q4_k,
    T.Q5_K: _q5_k,
    T.Q6_K: _q6_k,
}
