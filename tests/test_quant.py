"""Quantizers round-trip through gguf.quants.dequantize (the gguf package's reference decoder,
which llama.cpp's own tests mirror) within per-type error bounds."""
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from worker.tools.quant import QUANTIZERS, quantize

# Relative RMS error on normal data; measured values were ~80% of these.
REL_RMS = {T.F32: 0.0, T.F16: 3e-4, T.BF16: 2.5e-3, T.Q8_0: 6.5e-3, T.Q6_K: 0.023,
           T.Q5_0: 0.053, T.Q5_1: 0.045, T.Q5_K: 0.047, T.Q4_0: 0.105, T.Q4_1: 0.094,
           T.Q4_K: 0.095, T.MXFP4: 0.14, T.Q3_K: 0.19, T.Q2_K: 0.40}


def rel_rms(x, y):
    return np.sqrt(np.mean((x - y) ** 2) / np.mean(x ** 2))


def test_every_engine_type_has_a_quantizer():
    assert set(QUANTIZERS) == set(REL_RMS)


@pytest.mark.parametrize("qtype", list(REL_RMS), ids=lambda t: t.name)
def test_round_trip_error_is_small(qtype):
    x = np.random.default_rng(1).standard_normal((48, 768)).astype(np.float32) * 0.02
    packed = quantize(x, qtype)
    block, type_size = GGML_QUANT_SIZES[qtype]
    assert packed.dtype == np.uint8 and packed.shape == (48, 768 // block * type_size)
    assert rel_rms(x, dequantize(packed, qtype).reshape(x.shape)) <= REL_RMS[qtype]


@pytest.mark.parametrize("qtype", list(REL_RMS), ids=lambda t: t.name)
def test_awkward_rows(qtype):
    """Zero, constant, one-signed and wide-range rows: no NaN, error bounded by the row's scale."""
    rng = np.random.default_rng(2)
    rows = np.stack([np.zeros(512), np.full(512, 0.7), np.abs(rng.standard_normal(512)) + 3,
                     -np.abs(rng.standard_normal(512)) - 3,
                     rng.standard_normal(512) * np.logspace(-3, 2, 512)]).astype(np.float32)
    back = dequantize(quantize(rows, qtype), qtype).reshape(rows.shape)
    assert np.isfinite(back).all()
    assert np.array_equal(back[0], rows[0])
    for row, got in zip(rows[1:4], back[1:4]):
        assert rel_rms(row, got) <= max(REL_RMS[qtype], 1e-6) * 2


def test_exact_types_match_numpy_casts():
    x = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
    assert np.array_equal(quantize(x, T.F32).view(np.float32), x)
    assert np.array_equal(quantize(x, T.F16).view(np.float16), x.astype(np.float16))
    bf16 = quantize(x, T.BF16).view(np.uint16).astype(np.uint32) << 16
    assert np.abs(bf16.view(np.float32) - x).max() <= np.abs(x).max() * 2 ** -8


def test_row_length_must_fill_blocks():
    with pytest.raises(ValueError, match="multiple of Q4_K's block size 256"):
        quantize(np.zeros((2, 128), np.float32), T.Q4_K)
