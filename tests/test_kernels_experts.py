"""The mixture-of-experts kernels (kernels/experts.py) on the real device against numpy: routing
(top-k of the router logits and both families' weights), the mat-vecs over the chosen experts'
rows (weights dequantized by gguf.quants), with gpt-oss's biases and clamped SwiGLU, expert
tensors split into parts between experts, and the weighted sum into the residual."""
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from tests.kernel_io import Device, f32, own_context
from tests.test_kernels_matmul import assert_close, random_weights
from tests.test_kernels_mmq import exact_activations
from worker.engine.intmath import cdiv
from worker.engine.kernels import experts
from worker.engine.kernels.paths import paths
from worker.engine.kernels.tensor import free_tensor, upload_tensor
from worker.engine.kernels.x8 import Quantized, quantize_x8, x8_bytes
from worker.engine.weight_types import row_bytes


def route_reference(logits, n_used, softmax_chosen, norm):
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :n_used]
    chosen = np.take_along_axis(logits, ids, axis=1).astype(np.float64)
    if softmax_chosen:
        w = np.exp(chosen - chosen.max(1, keepdims=True))
        w /= w.sum(1, keepdims=True)
    else:
        all_w = np.exp(logits - logits.max(1, keepdims=True))
        w = np.take_along_axis(all_w / all_w.sum(1, keepdims=True), ids, axis=1)
    if norm:
        w /= np.maximum(w.sum(1, keepdims=True), 6.103515625e-5)
    return ids, w


@pytest.mark.parametrize("n_expert, n_used, softmax_chosen, norm, biased", [
    (128, 8, False, True, False),    # Qwen3-30B-A3B: softmax over all, renormalised over the chosen
    (32, 4, True, False, True),      # gpt-oss-20b: softmax over the chosen logits, the router's bias first
    (130, 32, False, False, False),  # more experts than threads, the most chosen the kernel keeps
    (512, 8, False, True, False),    # the most experts the kernels count: eight logits per invocation
])
def test_route_matches_numpy(dev, n_expert, n_used, softmax_chosen, norm, biased):
    n = 5
    rng = np.random.default_rng(n_expert)
    logits = f32(rng, n, n_expert) * 3
    bias = f32(rng, n_expert) * 3 if biased else None
    ids, weights = dev.empty(4 * n * n_used), dev.empty(4 * n * n_used)
    dev.run(lambda rec: experts.route(rec, dev.put(logits), ids, weights, n, n_expert, n_used, softmax_chosen, norm,
                                      None if bias is None else dev.put(bias)))
    ref_ids, ref_w = route_reference(logits if bias is None else logits + bias, n_used, softmax_chosen, norm)
    np.testing.assert_array_equal(dev.get(ids, np.uint32, n * n_used).reshape(n, n_used), ref_ids)
    np.testing.assert_allclose(dev.get(weights, count=n * n_used).reshape(n, n_used), ref_w, rtol=1e-5, atol=1e-7)


def expert_weights(qtype, n_expert, rows, cols, seed):
    """(GGUF bytes of the 3-D tensor, dequantized [n_expert, rows, cols])."""
    raw, w = random_weights(qtype, n_expert * rows, cols, seed)
    return raw, w.reshape(n_expert, rows, cols)


def upload_experts(ctx, qtype, raw, n_expert, rows, cols):
    return upload_tensor(ctx, "exps", qtype, (cols, rows, n_expert), raw)


SLOT_IDS = np.array([5, 0, 2, 5, 1, 3], np.uint32)   # 3 tokens x 2 experts; expert 4 never chosen


@pytest.mark.parametrize("qtype", [T.F16, T.Q8_0, T.Q4_K, T.Q6_K, T.MXFP4], ids=lambda t: t.name)
@pytest.mark.parametrize("x_per_slot", [False, True])
def test_expert_mat_vec_reads_the_chosen_experts(dev, qtype, x_per_slot):
    n_expert, rows, cols, n_used = 6, 33, 256, 2
    raw, w = expert_weights(qtype, n_expert, rows, cols, seed=3)
    tensor = upload_experts(dev.ctx, qtype, raw, n_expert, rows, cols)
    x = f32(np.random.default_rng(4), len(SLOT_IDS) if x_per_slot else len(SLOT_IDS) // n_used, cols)
    y = dev.empty(4 * len(SLOT_IDS) * rows)
    try:
        dev.run(lambda rec: experts.matmul_experts(rec, tensor, dev.put(x), y, dev.put(SLOT_IDS), len(SLOT_IDS),
                                                   n_used, x_per_slot))
    finally:
        free_tensor(dev.ctx, tensor)
    got = dev.get(y, count=len(SLOT_IDS) * rows).reshape(len(SLOT_IDS), rows)
    ref = np.stack([w[e] @ x[z if x_per_slot else z // n_used].astype(np.float64) for z, e in enumerate(SLOT_IDS)])
    assert_close(got, ref)


def oai_reference(gate, up):
    gate = np.minimum(gate, 7.0)
    return gate / (1 + np.exp(-1.702 * gate)) * (np.clip(up, -7.0, 7.0) + 1)


def run_freeing(dev, tensors, record):
    """dev.run(record), then the expert tensors freed whatever happened."""
    try:
        dev.run(record)
    finally:
        for t in tensors:
            free_tensor(dev.ctx, t)


def assert_glu(got, gate_ref, up_ref, biases):
    """got [slots, rows] against silu(gate) * up of the references, or with `biases` (the
    experts' gate and up bias rows) gpt-oss's clamped SwiGLU of them, which must reach the clamp."""
    if biases is None:
        assert_close(got, gate_ref / (1 + np.exp(-gate_ref)) * up_ref)
        return
    gate_ref, up_ref = gate_ref + biases[0][SLOT_IDS], up_ref + biases[1][SLOT_IDS]
    assert (gate_ref > 7).any() and (np.abs(up_ref) > 7).any()
    assert_close(got, oai_reference(gate_ref, up_ref))


@pytest.mark.parametrize("qtype", [T.Q4_K, T.MXFP4], ids=lambda t: t.name)
@pytest.mark.parametrize("oai", [False, True])
def test_expert_glu_and_down_with_biases(dev, qtype, oai):
    """Gate+up of the chosen experts fused with SwiGLU (gpt-oss: biases, then its clamped form,
    with gate and up values past the clamp), then the down product with its bias."""
    n_expert, rows, cols, n_used = 6, 40, 256, 2
    rng = np.random.default_rng(9)
    raw_g, wg = expert_weights(qtype, n_expert, rows, cols, seed=1)
    raw_u, wu = expert_weights(qtype, n_expert, rows, cols, seed=2)
    raw_d, wd = expert_weights(T.Q8_0, n_expert, cols, 32, seed=3)
    tensors = [upload_experts(dev.ctx, qtype, raw_g, n_expert, rows, cols),
               upload_experts(dev.ctx, qtype, raw_u, n_expert, rows, cols)]
    n_tokens = len(SLOT_IDS) // n_used
    x = f32(rng, n_tokens, cols)
    gate_ref = np.stack([wg[e] @ x[z // n_used].astype(np.float64) for z, e in enumerate(SLOT_IDS)])
    x *= 12 / np.abs(gate_ref).max()        # gate and up values up to about +-12: past the clamp at 7
    gate_ref, up_ref = (np.stack([w_[e] @ x[z // n_used].astype(np.float64) for z, e in enumerate(SLOT_IDS)])
                        for w_ in (wg, wu))
    b_gate, b_up = f32(rng, n_expert, rows), f32(rng, n_expert, rows)
    out = dev.empty(4 * len(SLOT_IDS) * rows)
    ids = dev.put(SLOT_IDS)
    biases = (dev.put(b_gate), dev.put(b_up)) if oai else None
    run_freeing(dev, tensors, lambda rec: experts.matmul_experts_glu(rec, *tensors, dev.put(x), out, ids,
                                                                      len(SLOT_IDS), n_used, biases))
    got = dev.get(out, count=len(SLOT_IDS) * rows).reshape(len(SLOT_IDS), rows)
    assert_glu(got, gate_ref, up_ref, (b_gate, b_up) if oai else None)
    # the down product (Q8_0, K = 32) of each slot's first 32 activations, with its bias
    down = upload_experts(dev.ctx, T.Q8_0, raw_d, n_expert, cols, 32)
    act = np.ascontiguousarray(got[:, :32])
    b_down = f32(rng, n_expert, cols)
    y = dev.empty(4 * len(SLOT_IDS) * cols)
    run_freeing(dev, [down], lambda rec: experts.matmul_experts(rec, down, dev.put(act), y, ids, len(SLOT_IDS),
                                                                 n_used, True, bias=dev.put(b_down)))
    ref = np.stack([wd[e] @ act[z].astype(np.float64) + b_down[e] for z, e in enumerate(SLOT_IDS)])
    assert_close(dev.get(y, count=len(SLOT_IDS) * cols).reshape(len(SLOT_IDS), cols), ref)


@pytest.mark.parametrize("qtype, oai", [(T.Q4_K, False), (T.Q6_K, False), (T.Q6_K, True), (T.Q8_0, False),
                                        (T.MXFP4, True)],
                         ids=lambda v: v.name if isinstance(v, T) else ("oai" if v else "silu"))
def test_expert_glu_over_8bit_x(dev, qtype, oai):
    """The decode gate+up kernel over 8-bit x (quantize_x8's blocks of each token's input): item
    loads or, where a row has fewer items than the workgroup has threads, 16-value slices (Q4_K,
    Q6_K: which, test_x8_expert_rows_of_few_items_take_slices) and slices (Q8_0; MXFP4 and Q6_K
    with gpt-oss's biases and clamp), against numpy over activations that the 8-bit blocks hold
    exactly (tests/test_kernels_mmq.py)."""
    if "mmq" not in paths(dev.ctx):
        pytest.skip(f"{dev.ctx.info.name} has no integer dot products")
    n_expert, rows, cols, n_used = 6, 40, 512, 2
    n_tokens = len(SLOT_IDS) // n_used
    (raw_g, wg), (raw_u, wu) = (expert_weights(qtype, n_expert, rows, cols, seed=s) for s in (5, 6))
    x = exact_activations(n_tokens, cols, seed=7)
    # gate and up values up to about +-12 (past gpt-oss's clamp at 7), by a power of two that keeps x exact
    peak = max(np.abs(w[e] @ x[z // n_used]).max() for w in (wg, wu) for z, e in enumerate(SLOT_IDS))
    x *= np.float32(2.0 ** np.round(np.log2(12 / peak)))
    gate_ref, up_ref = (np.stack([w[e] @ x[z // n_used].astype(np.float64) for z, e in enumerate(SLOT_IDS)])
                        for w in (wg, wu))
    rng = np.random.default_rng(8)
    b_gate, b_up = f32(rng, n_expert, rows), f32(rng, n_expert, rows)
    tensors = [upload_experts(dev.ctx, qtype, raw, n_expert, rows, cols) for raw in (raw_g, raw_u)]
    out, x8, ids = dev.empty(4 * len(SLOT_IDS) * rows), dev.empty(x8_bytes(n_tokens, cols)), dev.put(SLOT_IDS)
    biases = (dev.put(b_gate), dev.put(b_up)) if oai else None

    def record(rec):
        quantize_x8(rec, dev.put(x), x8, n_tokens, cols)
        rec.barrier()
        experts.matmul_experts_glu(rec, *tensors, Quantized(x8), out, ids, len(SLOT_IDS), n_used, biases)
    run_freeing(dev, tensors, record)
    got = dev.get(out, count=len(SLOT_IDS) * rows).reshape(len(SLOT_IDS), rows)
    assert_glu(got, gate_ref, up_ref, (b_gate, b_up) if oai else None)


@pytest.mark.parametrize("qtype, biased", [(T.Q4_K, False), (T.Q6_K, False), (T.Q6_K, True), (T.Q5_0, True),
                                           (T.MXFP4, True)],
                         ids=lambda v: v.name if isinstance(v, T) else ("bias" if v else "plain"))
def test_expert_down_over_8bit_x(dev, qtype, biased):
    """The decode down products over 8-bit x, a row per slot (quantize_x8's blocks of the slots'
    activations): item loads or slices as for the gate+up (Q4_K, Q6_K), and 16-value slices
    (Q5_0, MXFP4; with gpt-oss's bias rows, and Q6_K), against numpy over activations the 8-bit
    blocks hold exactly."""
    if "mmq" not in paths(dev.ctx):
        pytest.skip(f"{dev.ctx.info.name} has no integer dot products")
    n_expert, rows, cols, n_used = 6, 40, 512, 2
    raw, w = expert_weights(qtype, n_expert, rows, cols, seed=9)
    tensor = upload_experts(dev.ctx, qtype, raw, n_expert, rows, cols)
    act = exact_activations(len(SLOT_IDS), cols, seed=10)
    bias = f32(np.random.default_rng(11), n_expert, rows)
    y, x8 = dev.empty(4 * len(SLOT_IDS) * rows), dev.empty(x8_bytes(len(SLOT_IDS), cols))

    def record(rec):
        quantize_x8(rec, dev.put(act), x8, len(SLOT_IDS), cols)
        rec.barrier()
        experts.matmul_experts(rec, tensor, Quantized(x8), y, dev.put(SLOT_IDS), len(SLOT_IDS), n_used, True,
                               bias=dev.put(bias) if biased else None)
    run_freeing(dev, [tensor], record)
    ref = np.stack([w[e] @ act[z].astype(np.float64) + (bias[e] if biased else 0) for z, e in enumerate(SLOT_IDS)])
    assert_close(dev.get(y, count=len(SLOT_IDS) * rows).reshape(len(SLOT_IDS), rows), ref)


def test_x8_expert_rows_of_few_items_take_slices(dev):
    """The variant rule (experts.X8_ITEM_VALUES): a K-quant row of fewer items than the workgroup
    has threads takes the slices, else the item loads; other types have one 8-bit variant."""
    if "mmq" not in paths(dev.ctx):
        pytest.skip(f"{dev.ctx.info.name} has no integer dot products")
    threads = experts.expert_shape(dev.ctx)[0]
    x8 = Quantized(dev.empty(16))
    for qtype, item in [(T.Q4_K, 64), (T.Q6_K, 128)]:
        for cols, variant in [(256 * cdiv(threads * item, 256), "_x8"), (256 * (threads * item // 256 - 1), "_x8_slices")]:
            if cols == 0:
                continue
            w = SimpleNamespace(ggml_type=qtype, cols=cols)
            assert experts._x8_op(dev.ctx, "mul_mat_vec_id", w, x8, None)[0] == "mul_mat_vec_id" + variant, (qtype, cols)
    assert experts._x8_op(dev.ctx, "mul_mat_vec_id", SimpleNamespace(ggml_type=T.Q5_0, cols=32), x8, None)[0] \
        == "mul_mat_vec_id_x8"


def test_experts_split_into_parts_between_experts(vk_settings):
    """A binding range of 2.5 experts: parts of two experts each, every slot served by its part."""
    n_expert, rows, cols, n_used = 6, 33, 256, 2
    expert_bytes = rows * row_bytes(T.Q8_0, cols)
    with own_context(vk_settings, block_size=16 << 20, max_binding_range=expert_bytes * 5 // 2) as ctx:
        dev = Device(ctx)
        raw, w = expert_weights(T.Q8_0, n_expert, rows, cols, seed=7)
        tensor = upload_experts(ctx, T.Q8_0, raw, n_expert, rows, cols)
        assert [(first, count) for _, first, count in tensor.parts] == [(0, 2 * rows), (2 * rows, 2 * rows),
                                                                        (4 * rows, 2 * rows)]
        x = f32(np.random.default_rng(8), len(SLOT_IDS) // n_used, cols)
        y = dev.empty(4 * len(SLOT_IDS) * rows)
        dev.run(lambda rec: experts.matmul_experts(rec, tensor, dev.put(x), y, dev.put(SLOT_IDS), len(SLOT_IDS),
                                                   n_used, False))
        got = dev.get(y, count=len(SLOT_IDS) * rows).reshape(len(SLOT_IDS), rows)
        free_tensor(ctx, tensor)
        dev.close()
    assert_close(got, np.stack([w[e] @ x[z // n_used].astype(np.float64) for z, e in enumerate(SLOT_IDS)]))


def test_combine_adds_the_weighted_experts_to_the_residual(dev):
    n, n_used, n_embd = 3, 4, 300
    rng = np.random.default_rng(11)
    y, weights, x = f32(rng, n * n_used, n_embd), f32(rng, n, n_used), f32(rng, n, n_embd)
    bx = dev.put(x)
    dev.run(lambda rec: experts.combine(rec, dev.put(y), dev.put(weights), bx, n, n_used, n_embd))
    ref = x + np.einsum("tj,tjc->tc", weights.astype(np.float64), y.reshape(n, n_used, n_embd))
    np.testing.assert_allclose(dev.get(bx, count=n * n_embd).reshape(n, n_embd), ref, rtol=1e-5, atol=1e-6)


def test_combine_sigmoid_gates_a_shared_expert(dev):
    """Qwen2-MoE's shared expert: x[t] += sigmoid(logit[t]) * y[t], logits of both signs."""
    n, n_embd = 5, 300
    rng = np.random.default_rng(13)
    y, x = f32(rng, n, n_embd), f32(rng, n, n_embd)
    logits = np.array([-6.0, -0.5, 0.0, 1.5, 9.0], np.float32)
    bx = dev.put(x)
    dev.run(lambda rec: experts.combine(rec, dev.put(y), dev.put(logits), bx, n, 1, n_embd, sigmoid=True))
    ref = x + y.astype(np.float64) / (1 + np.exp(-logits.astype(np.float64)))[:, None]
    np.testing.assert_allclose(dev.get(bx, count=n * n_embd).reshape(n, n_embd), ref, rtol=1e-5, atol=1e-6)


def test_group_tiles_every_slot_once_by_expert(dev):
    """40 slots over 6 experts (expert 4 unused): tiles of one expert each, at most tile_cols
    slots, every slot in exactly one tile, unused tiles empty."""
    n_expert, cols = 6, experts.tile_cols(dev.ctx)
    ids = np.random.default_rng(12).choice([0, 1, 2, 3, 5], 40).astype(np.uint32)
    out = dev.empty(experts.tiles_bytes(len(ids), n_expert, cols))
    dev.run(lambda rec: experts.group(rec, dev.put(ids), out, len(ids), n_expert))
    words = dev.get(out, np.uint32, experts.tiles_bytes(len(ids), n_expert, cols) // 4)
    slots, tiles = words[:len(ids)], words[len(ids):].reshape(-1, 3)
    seen = []
    for expert, first, count in tiles[tiles[:, 2] > 0]:
        assert count <= cols and (ids[slots[first:first + count]] == expert).all()
        seen += slots[first:first + count].tolist()
    assert sorted(seen) == list(range(len(ids)))
    assert len(tiles[tiles[:, 2] > 0]) == sum(-(-np.sum(ids == e) // cols) for e in range(n_expert))


@pytest.mark.parametrize("qtype", [T.Q4_K, T.MXFP4, T.Q6_K], ids=lambda t: t.name)
def test_tiled_expert_products_equal_per_slot_ones(dev, qtype):
    """A prefill's 20 tokens x 2 experts of 6 through the tiles (each tile's expert rows read once
    for its slots): the gate+up SwiGLU and the down product with bias equal numpy's per slot."""
    n_expert, rows, cols, n_used, n = 6, 40, 256, 2, 20
    rng = np.random.default_rng(13)
    ids = np.stack([rng.choice(n_expert, n_used, replace=False) for _ in range(n)]).reshape(-1).astype(np.uint32)
    raw_g, wg = expert_weights(qtype, n_expert, rows, cols, seed=4)
    raw_u, wu = expert_weights(qtype, n_expert, rows, cols, seed=5)
    raw_d, wd = expert_weights(T.Q8_0, n_expert, cols, 32, seed=6)
    gate, up = (upload_experts(dev.ctx, qtype, raw, n_expert, rows, cols) for raw in (raw_g, raw_u))
    down = upload_experts(dev.ctx, T.Q8_0, raw_d, n_expert, cols, 32)
    x = f32(rng, n, cols) * 0.05
    b_down = f32(rng, n_expert, cols)
    slots = len(ids)
    bids = dev.put(ids)
    tiles = dev.empty(experts.tiles_bytes(slots, n_expert, experts.tile_cols(dev.ctx)))
    act, y = dev.empty(4 * slots * rows), dev.empty(4 * slots * cols)
    act_in = dev.empty(4 * slots * 32)

    def record(rec):
        experts.group(rec, bids, tiles, slots, n_expert)
        rec.barrier()
        experts.matmul_experts_glu(rec, gate, up, dev.put(x), act, bids, slots, n_used, tiles=tiles)

    try:
        dev.run(record)
        got_act = dev.get(act, count=slots * rows).reshape(slots, rows)
        down_in = np.ascontiguousarray(got_act[:, :32])
        dev.ctx.upload(act_in, down_in)
        dev.run(lambda rec: experts.matmul_experts(rec, down, act_in, y, bids, slots, n_used, True,
                                                   bias=dev.put(b_down), tiles=tiles))
    finally:
        for t in (gate, up, down):
            free_tensor(dev.ctx, t)
    g = np.stack([wg[e] @ x[z // n_used].astype(np.float64) for z, e in enumerate(ids)])
    u = np.stack([wu[e] @ x[z // n_used].astype(np.float64) for z, e in enumerate(ids)])
    assert_close(got_act, g / (1 + np.exp(-g)) * u)
    ref = np.stack([wd[e] @ down_in[z].astype(np.float64) + b_down[e] for z, e in enumerate(ids)])
    assert_close(dev.get(y, count=slots * cols).reshape(slots, cols), ref)
