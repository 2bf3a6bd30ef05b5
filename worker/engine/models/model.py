"""The forward pass of every supported family on the GPU, recorded once per batch size and
replayed. What differs between families is a flag on the config (models/config.py) that this one
pass reads: q/k/v biases, per-head q/k RMSNorm, NeoX RoPE, tied embeddings, the embedding
scale, norms after attention and FFN, GeGLU, and sliding-window layers (each layer's
AttentionShape carries its RoPE base and window; the KV cache keeps every position).

Weights keep their GGUF names: layer i's `blk.i.attn_q.weight` is `self.layers[i]["attn_q"]`,
its bias `["attn_q.bias"]`. The model holds the weights and reads and writes the paged KV cache it
is given (worker/engine/kvcache.py); everything else a pass writes is in the Workspace the caller
passes (worker/engine/workspace.py). A pass's tokens may belong to several sequences: each
token's sequence slot and position are in the step buffer, and the logits are computed for the
last token, or, in a batched pass, for the rows the workspace's `rows` names.
"""
import re
from math import prod

import numpy as np
from gguf import GGMLQuantizationType as T

from worker.engine.kernels import attention as attn_ops
from worker.engine.kernels import elementwise, norm, rope
from worker.engine.kernels.matmul import get_rows, matmul, matmul_swiglu
from worker.engine.kernels.shapes import AttentionShape
from worker.engine.kernels.tensor import DeviceTensor, free_tensor, upload_tensor

_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


def _is_matrix(info) -> bool:
    """Matrices stay in their GGUF format as DeviceTensors; vectors (norms, biases, F32 columns)
    become plain f32 buffers."""
    return len(info.shape) > 1 and not (info.ggml_type == T.F32 and info.shape[1] == 1)


def glu_keys(model_file) -> set:
    """(type, rows, K) of the feed-forward gate weights that the fused gate+up kernel takes with
    their up weight (same type and shape)."""
    tensors = model_file.tensors
    return {(info.ggml_type, int(info.shape[1]), int(info.shape[0]))
            for name, info in tensors.items() if name.endswith(".ffn_gate.weight")
            and (up := tensors.get(name.replace("ffn_gate", "ffn_up"))) is not None
            and (up.ggml_type, up.shape) == (info.ggml_type, info.shape)}


def mat_vec_keys(model_file) -> set:
    """(type, rows, K) of every weight the forward pass multiplies: all matrices except the
    embedding table, which is looked up by row unless it is also the output head."""
    tied = "output.weight" not in model_file.tensors
    return {(info.ggml_type, prod(int(d) for d in info.shape[1:]), int(info.shape[0]))
            for name, info in model_file.tensors.items()
            if _is_matrix(info) and (tied or name != "token_embd.weight")}


class Model:
    def __init__(self, ctx, model_file, config, n_ctx: int, kv, progress=None,
                 mat_vec_shapes: tuple[dict, dict] | None = None):
        """`mat_vec_shapes`: (type, rows, K) -> tuned mat-vec shape (worker/engine/kernels/tuning.py)
        of the weights in `mat_vec_keys`, and of the gates in `glu_keys` through the fused gate+up
        kernel; the others keep the fixed shape."""
        self.ctx, self.config, self.n_ctx, self.kv = ctx, config, n_ctx, kv
        self.mat_vec_shapes, self.glu_shapes = mat_vec_shapes or ({}, {})
        self.layers = [dict() for _ in range(config.n_layer)]
        self.globals = {}
        for name, info in model_file.tensors.items():
            if name == "rope_freqs.weight":  # already in config.rope_freq_factors
                continue
            tensor = self._upload(info)
            match = _LAYER_TENSOR.match(name)
            if match:
                layer, base, kind = match.groups()
                self.layers[int(layer)][base if kind == "weight" else f"{base}.bias"] = tensor
            else:
                self.globals[name.removesuffix(".weight")] = tensor
            if progress is not None:
                progress(info.n_bytes)
        self.output = self.globals.get("output", self.globals["token_embd"])
        # one buffer per distinct set of rope factors (local and global layers may differ)
        factors = {config.layer_rope_freq_factors(i) for i in range(config.n_layer)} - {None}
        self.freq_buffers = {f: self._upload_f32(np.asarray(f, np.float32)) for f in factors}
        self.freq_factors = [self.freq_buffers.get(config.layer_rope_freq_factors(i))
                             for i in range(config.n_layer)]
        self.attention_shape = AttentionShape.from_config(config, n_ctx)
        self.layer_shapes = [AttentionShape.from_config(config, n_ctx, i) for i in range(config.n_layer)]

    def _upload(self, info):
        if not _is_matrix(info):
            return self._upload_f32(info.data.view(np.float32))
        tensor = upload_tensor(self.ctx, info.name, info.ggml_type, info.shape, info.data)
        key = (tensor.ggml_type, tensor.rows, tensor.cols)
        tensor.mat_vec_shape, tensor.glu_shape = self.mat_vec_shapes.get(key), self.glu_shapes.get(key)
        return tensor

    def _upload_f32(self, array):
        buffer = self.ctx.alloc(array.nbytes)
        self.ctx.upload(buffer, array)
        return buffer

    def free(self):
        """Returns every buffer of this model to the context (which may serve other models); the
        KV cache is its owner's."""
        tensors = [*self.globals.values(), *(t for layer in self.layers for t in layer.values())]
        for t in tensors:
            if isinstance(t, DeviceTensor):
                free_tensor(self.ctx, t)
            else:
                self.ctx.free(t)
        for buffer in self.freq_buffers.values():
            self.ctx.free(buffer)

    # -- the forward pass ------------------------------------------------------------------------
    def record_forward(self, rec, ws, n: int, logits, all_logits: bool = False, ids=None, step=None,
                       rows: int | None = None):
        """Tokens in `ids` (default ws.ids) with the (slot, position) pairs of `step` (default
        ws.step) -> logits of the last token, of all (all_logits), or of the `rows` tokens that
        ws.rows names (a batched pass; 0: no logits)."""
        assert n <= ws.n and (rows is None or rows <= ws.sequences)
        c = self.config
        get_rows(rec, self.globals["token_embd"], ws.ids if ids is None else ids, ws.x, n, c.embedding_scale)
        rec.barrier()
        for i, layer in enumerate(self.layers):
            self.record_attention(rec, ws, ws.step if step is None else step, i, layer, n)
            self.record_ffn(rec, ws, layer, n)
        if rows == 0:
            return
        if rows is not None:
            norm.rms_norm(rec, ws.x, self.globals["output_norm"], ws.xb, rows, c.n_embd, c.norm_eps, gather=ws.rows)
        else:
            rows = n if all_logits else 1
            last = ws.x if all_logits else ws.x.sub((n - 1) * c.n_embd * 4, c.n_embd * 4)
            norm.rms_norm(rec, last, self.globals["output_norm"], ws.xb, rows, c.n_embd, c.norm_eps)
        rec.barrier()
        matmul(rec, self.output, ws.xb, logits, rows)

    def record_attention(self, rec, ws, step, i, layer, n):
        c = self.config
        norm.rms_norm(rec, ws.x, layer["attn_norm"], ws.xb, n, c.n_embd, c.norm_eps)
        rec.barrier()
        for name, out in (("attn_q", ws.q), ("attn_k", ws.k), ("attn_v", ws.v)):
            matmul(rec, layer[name], ws.xb, out, n)
        rec.barrier()
        if c.has_qkv_bias:
            for name, out, width in (("attn_q", ws.q, c.n_head * c.head_dim),
                                     ("attn_k", ws.k, c.n_head_kv * c.head_dim),
                                     ("attn_v", ws.v, c.n_head_kv * c.head_dim)):
                elementwise.add_bias(rec, out, layer[f"{name}.bias"], n, width)
            rec.barrier()
        if c.has_qk_norm:
            norm.rms_norm(rec, ws.q, layer["attn_q_norm"], ws.q, n * c.n_head, c.head_dim, c.norm_eps)
            norm.rms_norm(rec, ws.k, layer["attn_k_norm"], ws.k, n * c.n_head_kv, c.head_dim, c.norm_eps)
            rec.barrier()
        # one dispatch: q rotated in place, k rotated and v copied into this layer's cache
        shape = self.layer_shapes[i]
        rope.rope_store_kv(rec, shape, ws.q, ws.k, ws.v, self.kv.layers[i], step, n, self.freq_factors[i])
        rec.barrier()
        attn_ops.attention(rec, shape, ws.q, self.kv.layers[i], ws.att, step, n, ws.attention)
        rec.barrier()
        self.record_residual(rec, ws, layer, "attn_output", ws.att, "post_attention_norm", n)

    def record_residual(self, rec, ws, layer, weight, inp, post_norm, n):
        """x += W inp, or with post norms x += rms_norm(W inp) (through xb, free by then)."""
        c = self.config
        if not c.has_post_norms:
            matmul(rec, layer[weight], inp, ws.x, n, y_accumulate=True)
            rec.barrier()
            return
        matmul(rec, layer[weight], inp, ws.xb, n)
        rec.barrier()
        norm.rms_norm(rec, ws.xb, layer[post_norm], ws.xb, n, c.n_embd, c.norm_eps)
        rec.barrier()
        elementwise.add(rec, ws.x, ws.xb, ws.x, n * c.n_embd)
        rec.barrier()

    def record_ffn(self, rec, ws, layer, n):
        c = self.config
        norm.rms_norm(rec, ws.x, layer["ffn_norm"], ws.xb, n, c.n_embd, c.norm_eps)
        rec.barrier()
        matmul_swiglu(rec, layer["ffn_gate"], layer["ffn_up"], ws.xb, ws.gate, n, up=ws.up, gelu=c.ffn_gelu)
        rec.barrier()
        self.record_residual(rec, ws, layer, "ffn_down", ws.gate, "post_ffw_norm", n)
