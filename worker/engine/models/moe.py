"""The mixture-of-experts FFN of the forward pass (models/model.py calls it where a dense model
runs its FFN norm, gate, up and down): the norm (in decode over 8-bit input, in f32 for the
router and in 8-bit blocks for the experts at once), router mat-vec, routing on the GPU, the
chosen experts' fused gate+up and their down products (both over 8-bit input where the dense
mat-vecs take it: decode on GPUs with integer dot products), and the weighted sum into the
residual stream. The buffers are the Workspace's moe_* ones (worker/engine/workspace.py).
Passes of more than MAT_VEC_MAX_COLS tokens (prefill) group the slots by expert first, so that
each expert's weights are read once per tile of its slots (kernels/experts.py): tiles of the
mat-vec kernels, or on the tiled and mmq paths of their mat-mat kernels (gate and up then two
products and a SwiGLU, as the dense mat-mat path does, through moe_up and on mmq the 8-bit x8;
the down products f32). A shared expert (Qwen2-MoE) is a dense SwiGLU FFN through the dense
kernels, its gate logit one more mat-vec row, both recorded with the router (they read the same
input); its down product is weighed by the gate's sigmoid into the residual after the chosen
experts' sum."""
from worker.engine.kernels import experts, norm
from worker.engine.kernels.matmul import matmul, matmul_swiglu
from worker.engine.kernels.paths import product_path
from worker.engine.kernels.x8 import Quantized, quantize_x8


def record_moe_ffn(rec, ws, layer, config, n: int):
    """x += sum over the chosen experts of weight * expert FFN(xb), xb = the FFN norm of x (and
    the shared expert's gated FFN(xb))."""
    c = config
    slots = n * c.n_expert_used
    chosen = experts.path(rec.ctx, n)
    x_glu = ws.xb
    # the dense rule for one column of the gate's type and K (8-bit kernel, decode_x8 on, K a multiple of 32)
    one_column = product_path(rec.ctx, 1, c.n_embd, qtype=layer["ffn_gate_exps"].ggml_type)
    if chosen == "mat_vec" and one_column == "mat_vec_x8":
        # xb for the router's product (f32) and its 8-bit blocks for the experts' gate+up: one dispatch
        norm.rms_norm_x8(rec, ws.x, layer[c.ffn_norm], ws.x8, n, c.n_embd, c.norm_eps, out=ws.xb)
        x_glu = Quantized(ws.x8)
    else:
        norm.rms_norm(rec, ws.x, layer[c.ffn_norm], ws.xb, n, c.n_embd, c.norm_eps)
    rec.barrier()
    matmul(rec, layer["ffn_gate_inp"], ws.xb, ws.moe_logits, n, x8=ws.x8, xh=ws.xh)
    if c.n_ff_shexp:   # on the mmq path each product quantizes xb into ws.x8 anew: a barrier between
        rec.barrier()
        matmul(rec, layer["ffn_gate_inp_shexp"], ws.xb, ws.moe_shared_gate, n, x8=ws.x8, xh=ws.xh)
        rec.barrier()
        matmul_swiglu(rec, layer["ffn_gate_shexp"], layer["ffn_up_shexp"], ws.xb, ws.gate, n, up=ws.up, x8=ws.x8,
                      xh=ws.xh)
    rec.barrier()
    experts.route(rec, ws.moe_logits, ws.moe_ids, ws.moe_weights, n, c.n_expert, c.n_expert_used,
                  c.expert_softmax_chosen, c.expert_weights_norm, layer["ffn_gate_inp.bias"] if c.ffn_oai else None)
    rec.barrier()
    tiles = ws.moe_tiles if chosen != "mat_vec" else None
    if tiles is not None:
        experts.group(rec, ws.moe_ids, tiles, slots, c.n_expert, experts.group_cols(rec.ctx, chosen))
        rec.barrier()
    biases = (layer["ffn_gate_exps.bias"], layer["ffn_up_exps.bias"]) if c.ffn_oai else None
    down_bias = layer["ffn_down_exps.bias"] if c.ffn_oai else None
    if chosen in experts.MAT_MAT_PATHS:
        experts.matmul_experts_glu_mm(rec, chosen, layer["ffn_gate_exps"], layer["ffn_up_exps"], ws.xb, ws.moe_gate,
                                      ws.moe_up, tiles, slots, c.n_expert_used, biases, x8=ws.x8)
        rec.barrier()
        # the down products take f32 input on the mmq path too: with 8-bit input as well (the
        # kernel gathers slots' 8-bit rows alike and is exact, tests/test_kernels_experts_mm.py;
        # ~1% per slot in the engine) tiny-gpt-oss's router logits drift enough that layer 3
        # flips token 2's second expert (margin 0.22, drift 0.12), 22% of its logits off
        experts.matmul_experts_mm(rec, "tiled", layer["ffn_down_exps"], ws.moe_gate, ws.moe_out, tiles, slots,
                                  c.n_expert_used, x_per_slot=True, bias=down_bias)
    else:
        experts.matmul_experts_glu(rec, layer["ffn_gate_exps"], layer["ffn_up_exps"], x_glu, ws.moe_gate,
                                   ws.moe_ids, slots, c.n_expert_used, biases, tiles)
        rec.barrier()
        x_down = ws.moe_gate
        if chosen == "mat_vec" and product_path(rec.ctx, 1, c.n_ff_exp, qtype=layer["ffn_down_exps"].ggml_type) \
                == "mat_vec_x8":
            # the slots' activations to 8 bits too, one dispatch (4.3 us on an H200) that pays: gpt-oss-20b's
            # down products 15.7 / 18.2 us a layer (Q5_0 / Q8_0) against 30.8 / 26.1 over f32, decode
            # 345 tok/s against 316; Qwen3-30B-A3B's (short rows: slices) 10.5 / 13.6 against 15.5 / 16.7
            quantize_x8(rec, ws.moe_gate, ws.x8, slots, c.n_ff_exp)
            rec.barrier()
            x_down = Quantized(ws.x8)
        experts.matmul_experts(rec, layer["ffn_down_exps"], x_down, ws.moe_out, ws.moe_ids, slots,
                               c.n_expert_used, x_per_slot=True, bias=down_bias, tiles=tiles)
    rec.barrier()
    experts.combine(rec, ws.moe_out, ws.moe_weights, ws.x, n, c.n_expert_used, c.n_embd)
    rec.barrier()
    if c.n_ff_shexp:   # moe_out is free again
        matmul(rec, layer["ffn_down_shexp"], ws.gate, ws.moe_out, n, x8=ws.x8, xh=ws.xh)
        rec.barrier()
        experts.combine(rec, ws.moe_out, ws.moe_shared_gate, ws.x, n, 1, c.n_embd, sigmoid=True)
        rec.barrier()
