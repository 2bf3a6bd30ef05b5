"""The expert products of a prefill chunk through the mat-mat kernels (kernels/experts.py's
*_mm functions: mul_mat.comp and mul_mmq.comp with EXPERT_TILES over moe_group's tiles of 64
slots) against numpy: gguf.quants-dequantized weights, a routing where one expert has more than
64 slots (two tiles), one none and the rest partial tiles, experts whose rows end inside a row
tile, gpt-oss's biases and clamped SwiGLU, expert tensors split into parts between experts, and
which kernels a pass takes where.

The activations are test_kernels_mmq.py's exact ones (integers times a power of two per block
of 32, one of them +-127): their 8-bit blocks are x itself, so the mmq path is held to the float
kernels' tolerance against the same reference."""
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from tests.kernel_io import Device, f32, own_context
from tests.test_engine import _model
from tests.test_kernels_experts import expert_weights, oai_reference, upload_experts
from tests.test_kernels_matmul import assert_close
from tests.test_kernels_mmq import exact_activations
from worker.engine.kernels import experts
from worker.engine.kernels.matmul import MAT_MAT_TILE
from worker.engine.kernels.paths import mat_mat_path, paths
from worker.engine.kernels.shapes import AttentionShape
from worker.engine.kernels.tensor import free_tensor
from worker.engine.kernels.x8 import x8_bytes
from worker.engine.modelfile import ModelFile
from worker.engine.vk.device import COOPMAT, INTEGER_DOT, DeviceInfo
from worker.engine.weight_types import row_bytes
from worker.engine.workspace import Workspace

N_EXPERT, N_USED, N_TOKENS = 6, 2, 80


def routing(seed: int) -> np.ndarray:
    """80 tokens x 2 experts: expert 0 first choice of 70 tokens (70 slots: past one tile), expert
    4 never chosen, the others a few dozen slots each."""
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.choice([1, 2, 3, 5], N_USED, replace=False) for _ in range(N_TOKENS)])
    ids[:70, 0] = 0
    return ids.reshape(-1).astype(np.uint32)


def offered(ctx, chosen):
    if chosen not in paths(ctx):
        pytest.skip(f"{ctx.info.name} has no {chosen} kernel")


def grouped(dev, ids) -> object:
    slots = len(ids)
    tiles = dev.empty(experts.tiles_bytes(slots, N_EXPERT, MAT_MAT_TILE))
    bids = dev.put(ids)
    dev.run(lambda rec: experts.group(rec, bids, tiles, slots, N_EXPERT, MAT_MAT_TILE))
    return tiles


@pytest.mark.parametrize("chosen", ["tiled", "mmq"])
@pytest.mark.parametrize("qtype, oai", [(T.Q4_K, False), (T.MXFP4, True), (T.Q8_0, False), (T.F16, True)],
                         ids=["Q4_K", "MXFP4-oai", "Q8_0", "F16-oai"])
def test_expert_mat_mat_products_match_numpy(dev, chosen, qtype, oai):
    """Gate+up then SwiGLU (gpt-oss: biases, clamped, values past the clamp) over 72 rows per
    expert, then the down product with bias over 80 rows per expert of its own exact input per
    slot; F16 has no mmq kernel and takes the tiled one on that path."""
    offered(dev.ctx, chosen)
    rows, cols, down_rows = 72, 256, 80
    ids = routing(seed=21)
    slots = len(ids)
    assert np.bincount(ids, minlength=N_EXPERT)[[0, 4]].tolist() == [70, 0]
    rng = np.random.default_rng(22)
    raw_g, wg = expert_weights(qtype, N_EXPERT, rows, cols, seed=23)
    raw_u, wu = expert_weights(qtype, N_EXPERT, rows, cols, seed=24)
    raw_d, wd = expert_weights(qtype, N_EXPERT, down_rows, cols, seed=25)
    gate, up, down = (upload_experts(dev.ctx, qtype, raw, N_EXPERT, r, cols)
                      for raw, r in ((raw_g, rows), (raw_u, rows), (raw_d, down_rows)))
    x = exact_activations(N_TOKENS, cols, seed=26)
    g = np.stack([wg[e] @ x[z // N_USED].astype(np.float64) for z, e in enumerate(ids)])
    x *= np.float32(2.0 ** np.round(np.log2(12 / np.abs(g).max())))   # gate values past the clamp at 7
    g, u = (np.stack([w_[e] @ x[z // N_USED].astype(np.float64) for z, e in enumerate(ids)]) for w_ in (wg, wu))
    b_gate, b_up, b_down = f32(rng, N_EXPERT, rows), f32(rng, N_EXPERT, rows), f32(rng, N_EXPERT, down_rows)
    act_in = exact_activations(slots, cols, seed=27)
    tiles = grouped(dev, ids)
    out, up_scratch, y = dev.empty(4 * slots * rows), dev.empty(4 * slots * rows), dev.empty(4 * slots * down_rows)
    x8 = dev.empty(x8_bytes(slots, cols))
    biases = (dev.put(b_gate), dev.put(b_up)) if oai else None
    try:
        dev.run(lambda rec: experts.matmul_experts_glu_mm(rec, chosen, gate, up, dev.put(x), out, up_scratch, tiles,
                                                          slots, N_USED, biases, x8=x8))
        dev.run(lambda rec: experts.matmul_experts_mm(rec, chosen, down, dev.put(act_in), y, tiles, slots, N_USED,
                                                      True, bias=dev.put(b_down) if oai else None, x8=x8))
    finally:
        for t in (gate, up, down):
            free_tensor(dev.ctx, t)
    got = dev.get(out, count=slots * rows).reshape(slots, rows)
    if oai:
        g, u = g + b_gate[ids], u + b_up[ids]
        assert (g > 7).any() and (np.abs(u) > 7).any()
        assert_close(got, oai_reference(g, u))
    else:
        assert_close(got, g / (1 + np.exp(-g)) * u)
    ref = np.stack([wd[e] @ act_in[z].astype(np.float64) + (b_down[e] if oai else 0) for z, e in enumerate(ids)])
    assert_close(dev.get(y, count=slots * down_rows).reshape(slots, down_rows), ref)


@pytest.mark.parametrize("chosen", ["tiled", "mmq"])
def test_expert_mat_mat_over_parts_between_experts(vk_settings, chosen):
    """A binding range of 2.5 experts: parts of two experts each, every tile served by its part."""
    rows, cols = 72, 256
    expert_bytes = rows * row_bytes(T.Q8_0, cols)
    with own_context(vk_settings, block_size=16 << 20, max_binding_range=expert_bytes * 5 // 2) as ctx:
        offered(ctx, chosen)
        dev = Device(ctx)
        raw, w = expert_weights(T.Q8_0, N_EXPERT, rows, cols, seed=31)
        tensor = upload_experts(ctx, T.Q8_0, raw, N_EXPERT, rows, cols)
        assert len(tensor.parts) == 3
        ids = routing(seed=32)
        x = exact_activations(N_TOKENS, cols, seed=33)
        tiles = grouped(dev, ids)
        y, x8 = dev.empty(4 * len(ids) * rows), dev.empty(x8_bytes(N_TOKENS, cols))
        dev.run(lambda rec: experts.matmul_experts_mm(rec, chosen, tensor, dev.put(x), y, tiles, len(ids), N_USED,
                                                      False, x8=x8))
        got = dev.get(y, count=len(ids) * rows).reshape(len(ids), rows)
        free_tensor(ctx, tensor)
        dev.close()
    assert_close(got, np.stack([w[e] @ x[z // N_USED].astype(np.float64) for z, e in enumerate(ids)]))


def test_which_kernels_a_pass_takes(vk_ctx, vk_settings):
    """Decode keeps a mat-vec column per slot; a CPU driver's prefill the mat-vec tiles unless
    Settings.prefill_kernel names the tiled or mmq kernel, which then take the expert tiles too
    (a GPU's prefill: its mat-mat kernel where that has expert tiles; behind the cooperative-matrix
    kernel, which has none, the mmq tiles where offered, else the tiled kernel's)."""
    assert experts.path(vk_ctx, 8) == "mat_vec"
    dense = mat_mat_path(vk_ctx)
    gpu_path = {"tiled": "tiled", "mmq": "mmq", "coopmat": "mmq" if "mmq" in paths(vk_ctx) else "tiled"}[dense]
    assert experts.path(vk_ctx, 9) == ("mat_vec_tiles" if vk_ctx.info.kind == "cpu" else gpu_path)
    assert experts.group_cols(vk_ctx, "mat_vec_tiles") == experts.tile_cols(vk_ctx)
    for chosen in ("tiled", "mmq"):
        with own_context(dataclasses.replace(vk_settings, prefill_kernel=chosen)) as ctx:
            offered(ctx, chosen)
            assert (experts.path(ctx, 8), experts.path(ctx, 9)) == ("mat_vec", chosen)
            assert experts.group_cols(ctx, chosen) == 64


def test_the_plan_counts_the_mat_mat_expert_scratch(vk_settings, tmp_path):
    """qwen3-30b-a3b's expert shape at a chunk of 512: tiles of 64 slots and the up products per
    slot on both paths; the 8-bit input (mmq only) per token of the widest product input, the
    expert down products taking f32 input (models/moe.py)."""
    tiny = ModelFile.open(_model(tmp_path, "tiny-qwen3moe", "Q8_0")).config
    config = dataclasses.replace(tiny, n_embd=2048, n_ff=768, n_expert=128, n_expert_used=8, n_ff_exp=768)
    shape = AttentionShape.from_config(config, 1024)
    slots = 512 * 8
    sizes = {}
    for chosen in ("tiled", "mmq"):
        with own_context(dataclasses.replace(vk_settings, prefill_kernel=chosen)) as ctx:
            offered(ctx, chosen)
            sizes[chosen] = Workspace.kernel_sizes(ctx, config, 512, shape)
    for s in sizes.values():
        assert s["moe_tiles"] == 4 * (slots + 3 * (slots // 64 + 128))
        assert s["moe_up"] == 4 * slots * 768
    assert sizes["tiled"]["x8"] == 0
    assert sizes["mmq"]["x8"] == 512 * max(2048, config.n_head * config.head_dim) * 3 // 2


def test_gpus_with_matrix_units_take_the_mmq_expert_tiles(vk_settings, tmp_path):
    """A GPU with cooperative matrices and integer dot products (an H200): the dense products
    take the cooperative-matrix kernel, which has no expert tiles, and the experts the mmq ones,
    so a chunk's 8-bit input is planned for every token (it was sized for decode's groups)."""
    info = DeviceInfo(0, "gpu", "discrete", 8 << 30, 32, 1 << 32, 64, 1 << 30, 65535, 128, 1.0, frozenset(),
                      coopmat_shapes=((16, 16, 16),), int8_dot=True, int8_dot_accelerated=True)
    gpu = SimpleNamespace(info=info, extensions=frozenset({INTEGER_DOT, COOPMAT}), settings=vk_settings)
    if not {"coopmat", "mmq"} <= set(paths(gpu)):
        pytest.skip("no compiler here for the cooperative-matrix or integer-dot kernels")
    assert (mat_mat_path(gpu), experts.path(gpu, 8), experts.path(gpu, 512)) == ("coopmat", "mat_vec", "mmq")
    config = ModelFile.open(_model(tmp_path, "tiny-qwen3moe", "Q8_0")).config
    sizes = Workspace.kernel_sizes(gpu, config, 512, AttentionShape.from_config(config, 1024))
    assert sizes["x8"] == x8_bytes(512, max(config.n_embd, config.n_ff, config.n_head * config.head_dim))
    assert sizes["moe_up"] == 4 * 512 * config.n_expert_used * config.n_ff_exp

