"""The forward pass of every supported family on the GPU, recorded once per batch size and
replayed. What differs between families is a flag on the config (models/config.py) that this one
pass reads: q/k/v biases, per-head q/k RMSNorm, NeoX RoPE, tied embeddings, the embedding
scale, norms after attention and FFN, GeGLU, sliding-window layers (each layer's
AttentionShape carries its RoPE base and window; the KV cache keeps every position), attention
sinks and an attention output bias (gpt-oss), and a mixture-of-experts FFN in place of the dense
one (models/moe.py).

Weights keep their GGUF names: layer i's `blk.i.attn_q.weight` is `self.layers[i]["attn_q"]`,
its bias `["attn_q.bias"]`. Where Q and K (and V) share a type they are uploaded as one tensor,
`["attn_qkv"]`, which one mat-vec takes; `["attn_q"]` and the others are then views of it. The
model holds the weights and reads and writes the paged KV cache it is given
(worker/engine/kvcache.py); everything else a pass writes is in the Workspace the caller passes
(worker/engine/workspace.py). A pass's tokens may belong to several sequences: each token's
sequence slot and position are in the step buffer, and the logits are computed for the last
token, or, in a batched pass, for the rows the workspace's `rows` names. Split across contexts
(worker/engine/placement.py), each layer's tensors are on its stage's context and a pass is
recorded stage by stage (`record_forward(..., stage)`), the hidden state handed between them
through the workspaces' `handoff` (worker/engine/staged.py).
"""
import re
from math import prod

import numpy as np
from gguf import GGMLQuantizationType as T

from worker.engine.kernels import attention as attn_ops
from worker.engine.kernels import elementwise, norm, rope
from worker.engine.kernels.embedding import get_rows
from worker.engine.kernels.matmul import (BlocksOut, NormBlocks, folds_norm, matmul, matmul_qkv, matmul_swiglu,
                                          normed_input, writes_blocks)
from worker.engine.kernels.paths import X8_PATHS, product_path
from worker.engine.kernels.shapes import AttentionShape
from worker.engine.kernels.tensor import DeviceTensor, free_tensor, upload_rows, upload_tensor
from worker.engine.kernels.x8 import Quantized
from worker.engine.models.moe import record_moe_ffn

_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


def _is_matrix(info) -> bool:
    """Matrices stay in their GGUF format as DeviceTensors; vectors (norms, biases, F32 columns)
    and biases (an expert tensor's are [n_expert, rows]) become plain f32 buffers. A shared
    expert's gate is a vector the mat-vec takes as a matrix of one row."""
    if info.name.endswith(".ffn_gate_inp_shexp.weight"):
        return True
    return len(info.shape) > 1 and not (info.ggml_type == T.F32 and info.shape[1] == 1) \
        and not info.name.endswith(".bias")


def qkv_members(tensors, layer: int) -> list[str]:
    """The projections of a layer that are uploaded as one tensor: Q with K, and V too, as far as
    they share Q's type and row length (none when K's differ)."""
    names = [f"blk.{layer}.attn_{s}.weight" for s in "qkv"]
    infos = [tensors.get(name) for name in names]
    same = 0
    while same < 3 and infos[same] is not None and infos[same].ggml_type == infos[0].ggml_type \
            and len(infos[same].shape) == 2 and infos[same].shape[0] == infos[0].shape[0]:
        same += 1
    return names[:same] if same >= 2 else []


def glu_keys(model_file) -> set:
    """(type, rows, K) of the feed-forward gate weights (a shared expert's too) that the fused
    gate+up kernel takes with their up weight (same type and shape)."""
    tensors = model_file.tensors
    return {(info.ggml_type, int(info.shape[1]), int(info.shape[0]))
            for name, info in tensors.items() if name.endswith((".ffn_gate.weight", ".ffn_gate_shexp.weight"))
            and (up := tensors.get(name.replace("ffn_gate", "ffn_up"))) is not None
            and (up.ggml_type, up.shape) == (info.ggml_type, info.shape)}


# The weights whose one-column decode product is a residual one that writes the next RMSNorm's
# input (record_residual's NormBlocks, where the model's config lets it: `residual_keys`).
RESIDUAL_WEIGHTS = (".attn_output.weight", ".ffn_down.weight")


def residual_keys(model_file) -> set:
    """(type, rows, K) of the attention output and dense feed-forward down weights of a model
    whose residual products can write the next norm's input: no post norms (a norm between
    the product and the residual add) and no experts (the attention output's, no bias either)."""
    c = model_file.config
    if c.has_post_norms or c.n_expert:
        return set()
    suffixes = RESIDUAL_WEIGHTS[1:] if c.has_attn_out_bias else RESIDUAL_WEIGHTS
    return {(info.ggml_type, int(info.shape[1]), int(info.shape[0]))
            for name, info in model_file.tensors.items() if name.endswith(suffixes)}


def mat_vec_keys(model_file) -> set:
    """(type, rows, K) of every weight the dense mat-vec multiplies: all matrices except the
    embedding table, which is looked up by row unless it is also the output head, and the
    experts' (their kernel reads a few experts' rows, kernels/experts.py); Q, K and V joined
    (qkv_members) count as the one weight they are uploaded as."""
    tensors = model_file.tensors
    tied = "output.weight" not in tensors
    keys = {(info.ggml_type, prod(int(d) for d in info.shape[1:]), int(info.shape[0]))
            for name, info in tensors.items()
            if _is_matrix(info) and (tied or name != "token_embd.weight") and "_exps." not in name}
    layers = {int(m.group(1)) for name in tensors if (m := _LAYER_TENSOR.match(name))}
    for members in filter(None, (qkv_members(tensors, i) for i in layers)):
        first = tensors[members[0]]
        keys.add((first.ggml_type, sum(int(tensors[m].shape[1]) for m in members), int(first.shape[0])))
    return keys


class Model:
    def __init__(self, placement, model_file, config, n_ctx: int, kv, progress=None,
                 mat_vec_shapes: list[tuple[dict, dict, dict]] | None = None, coopmat_tiles: list[dict] | None = None,
                 cols_shapes: list[dict] | None = None):
        """`placement`: the Stages (worker/engine/placement.py) whose contexts hold each layer's
        tensors; the embedding table goes to the first, the other global tensors (output norm
        and head) to the last, and a tied embedding table to both. `mat_vec_shapes`, one per
        stage (tuned on its device): (type, rows, K) -> tuned mat-vec shape
        (worker/engine/kernels/tuning.py) of the weights in `mat_vec_keys`, and of the gates in
        `glu_keys` through the fused gate+up kernel; the others keep the fixed shape.
        `coopmat_tiles`, one per stage: the same keys -> tuned cooperative-matrix mat-mat tile
        (worker/engine/kernels/tile_tuning.py). `cols_shapes`, one per stage: the same keys ->
        {(columns, gate+up): tuned 8-bit mat-cols shape} (worker/engine/kernels/cols_tuning.py)."""
        self.stages, self.config, self.n_ctx, self.kv = placement, config, n_ctx, kv
        first, last = placement[0].ctx, placement[-1].ctx
        # context -> (mat-vec shapes, gate+up shapes, residual products' shapes, coopmat tiles,
        # 8-bit mat-cols shapes) its tensors run with
        self._tuned = {id(stage.ctx): (*(mat_vec_shapes[stage.index] if mat_vec_shapes else ({}, {}, {})),
                                       coopmat_tiles[stage.index] if coopmat_tiles else {},
                                       cols_shapes[stage.index] if cols_shapes else {})
                       for stage in placement}
        self._owned: list[tuple[object, object]] = []   # (context, buffer or DeviceTensor)
        self.layers = [dict() for _ in range(config.n_layer)]
        layer_ctx = [stage.ctx for stage in placement for _ in stage.layers]
        self.globals = {}
        tensors = model_file.tensors
        fused = {name: i for i in range(config.n_layer) for name in qkv_members(tensors, i)}
        for name, info in tensors.items():
            if name == "rope_freqs.weight" or name in fused:  # config.rope_freq_factors; _upload_qkv
                continue
            match = _LAYER_TENSOR.match(name)
            if match:
                layer, base, kind = match.groups()
                self.layers[int(layer)][base if kind == "weight" else f"{base}.bias"] = \
                    self._upload(layer_ctx[int(layer)], info)
            else:
                self.globals[name.removesuffix(".weight")] = self._upload(
                    first if name == "token_embd.weight" else last, info)
            if progress is not None:
                progress(info.n_bytes)
        for i in sorted(set(fused.values())):
            infos = [tensors[name] for name in qkv_members(tensors, i)]
            self._upload_qkv(layer_ctx[i], self.layers[i], infos)
            if progress is not None:
                progress(sum(info.n_bytes for info in infos))
        self.output = self.globals["output"] if "output" in self.globals else (
            self.globals["token_embd"] if first is last else self._upload(last, tensors["token_embd.weight"]))
        # one buffer per distinct set of rope factors (local and global layers may differ) per context
        self.freq_factors = [None] * config.n_layer
        buffers = {}
        for i in range(config.n_layer):
            factors = config.layer_rope_freq_factors(i)
            if factors is not None:
                key = (id(layer_ctx[i]), factors)
                if key not in buffers:
                    buffers[key] = self._upload_f32(layer_ctx[i], np.asarray(factors, np.float32))
                self.freq_factors[i] = buffers[key]
        self.attention_shape = AttentionShape.from_config(config, n_ctx)
        self.layer_shapes = [AttentionShape.from_config(config, n_ctx, i) for i in range(config.n_layer)]

    def _upload(self, ctx, info):
        if not _is_matrix(info):
            return self._upload_f32(ctx, info.data.view(np.float32))
        tensor = upload_tensor(ctx, info.name, info.ggml_type, info.shape, info.data)
        self._owned.append((ctx, tensor))
        key = tensor.key
        shapes, glu_shapes, residual_shapes, tiles, cols = self._tuned[id(ctx)]
        residual = info.name.endswith(RESIDUAL_WEIGHTS) and key in residual_shapes
        tensor.mat_vec_shape = residual_shapes[key] if residual else shapes.get(key)
        tensor.glu_shape = glu_shapes.get(key)
        tensor.coopmat_tile, tensor.cols_shapes = tiles.get(key), cols.get(key, {})
        return tensor

    def _upload_qkv(self, ctx, layer: dict, infos):
        """Q and K (and V) as one tensor and its views, or one by one where they cannot be."""
        names = [_LAYER_TENSOR.match(info.name).group(2) for info in infos]
        joined = upload_rows(ctx, f"{infos[0].name} and its K/V", infos[0].ggml_type,
                             [info.shape for info in infos], [info.data for info in infos])
        if joined is None:
            layer.update({name: self._upload(ctx, info) for name, info in zip(names, infos)})
            return
        fused, views = joined
        self._owned.append((ctx, fused))
        shapes, _, _, tiles, cols = self._tuned[id(ctx)]
        fused.mat_vec_shape, fused.cols_shapes = shapes.get(fused.key), cols.get(fused.key, {})
        fused.coopmat_tile = tiles.get(fused.key)
        for view in views:   # alone they serve the mmq path's products
            view.mat_vec_shape, view.coopmat_tile = shapes.get(view.key), tiles.get(view.key)
        layer["attn_qkv"] = fused
        layer.update(zip(names, views))

    def _upload_f32(self, ctx, array):
        buffer = ctx.alloc(array.nbytes)
        ctx.upload(buffer, array)
        self._owned.append((ctx, buffer))
        return buffer

    def free(self):
        """Returns every buffer of this model to its context (which may serve other models); the
        KV cache is its owner's."""
        for ctx, t in self._owned:
            if isinstance(t, DeviceTensor):
                free_tensor(ctx, t)
            else:
                ctx.free(t)
        self._owned = []

    # -- the forward pass ------------------------------------------------------------------------
    def tiled_attention(self, n: int, distinct: bool = False) -> bool:
        """Whether a pass of n tokens (`distinct`: as record_forward's) takes the tiled attention
        kernel in some layer where the device has it, reading the tile list the host writes."""
        if n < attn_ops.TILED_MIN_TOKENS:   # every decode step asks: the short answer without the layers
            return False
        qk_norm = self.config.has_qk_norm
        return any(attn_ops.takes_tiles(shape, cache, n, attn_ops.takes_rope(cache, n, qk_norm, distinct))
                   for shape, cache in zip(self.layer_shapes, self.kv.layers))

    def record_forward(self, rec, ws, stage, n: int, logits=None, all_logits: bool = False, ids: str = "ids",
                       step: str = "step", rows: int | None = None, distinct: bool = False):
        """Stage `stage`'s part of the pass, into its recording `rec` over its workspace `ws`:
        tokens in the workspace's buffer named `ids` (the first stage's) with the (slot, position)
        pairs of the one named `step` -> logits of the last token, of all (all_logits), or of the
        `rows` tokens that ws.rows names (a batched pass; 0: no logits), into `logits` (the last
        stage's). A stage after the first starts from the hidden state in ws.handoff, one before
        the last leaves its own there (memory the stages share, Runner). `distinct`: each token is
        the only one of its sequence (record_attention)."""
        assert n <= ws.n and (rows is None or rows <= ws.sequences)
        c = self.config
        if stage.first:
            get_rows(rec, self.globals["token_embd"], getattr(ws, ids), ws.x, n, c.embedding_scale)
        else:
            rec.copy(ws.handoff, ws.x, 4 * n * c.n_embd)
        rec.barrier()
        # a batched pass's rows are gathered before the head, but for one token and its row (one
        # sequence decoding): then, as for the last token, the last residual product writes the
        # head's norm input and the head folds it
        gathered = rows is not None and not rows == n == 1
        head = stage.last and not gathered and not all_logits
        ready = None   # the next norm's input, where the residual product before it wrote it
        for i in stage.layers:
            layer = self.layers[i]
            ready = self.record_attention(rec, ws, getattr(ws, step), i, layer, n, ready, distinct)
            after = (self.layers[i + 1]["attn_norm"], self._projections(self.layers[i + 1])) if i + 1 in stage.layers \
                else (self.globals["output_norm"], [self.output]) if head else None
            ready = self.record_ffn(rec, ws, layer, n, ready, after)
        if not stage.last:
            rec.copy(ws.x, ws.handoff, 4 * n * c.n_embd)
            return
        if rows == 0:
            return
        if gathered:
            norm.rms_norm(rec, ws.x, self.globals["output_norm"], ws.xb, rows, c.n_embd, c.norm_eps, gather=ws.rows)
            rec.barrier()
            x_in, folded = ws.xb, None
        else:
            rows = n if all_logits else 1
            last = ws.x if all_logits else ws.x.sub((n - 1) * c.n_embd * 4, c.n_embd * 4)
            x_in, folded = (ready, None) if ready is not None else normed_input(
                rec, last, self.globals["output_norm"], ws.xb, rows, c.n_embd, c.norm_eps, [self.output], x8=ws.x8,
                xh=ws.xh)
        matmul(rec, self.output, x_in, logits, rows, norm=folded, x8=ws.x8, xh=ws.xh)

    @staticmethod
    def _projections(layer) -> list:
        return [layer["attn_q"], layer["attn_k"], layer["attn_v"]]

    def record_attention(self, rec, ws, step, i, layer, n, ready=None, distinct: bool = False):
        """The attention block of layer i, x += its output; `ready`: its norm's input where the
        product before wrote it (Quantized); `distinct`: each token is the only one of its
        sequence in the pass (attention.takes_rope). Returns the FFN norm's input where the output
        product writes it, else None."""
        c = self.config
        projections = self._projections(layer)
        x_in, folded = (ready, None) if ready is not None else normed_input(
            rec, ws.x, layer["attn_norm"], ws.xb, n, c.n_embd, c.norm_eps, projections, x8=ws.x8, xh=ws.xh)
        matmul_qkv(rec, layer.get("attn_qkv"), projections, x_in, [ws.q, ws.k, ws.v], n, norm=folded, x8=ws.x8,
                   xh=ws.xh)
        rec.barrier()
        # q (biased and normalised per head first where the model says) rotated, k likewise and
        # rotated and v (biased) appended to this layer's cache: by attention itself in decode,
        # else in a dispatch of its own
        bias = tuple(layer[f"attn_{w}.bias"] for w in "qkv") if c.has_qkv_bias else None
        shape, cache = self.layer_shapes[i], self.kv.layers[i]
        own = None
        if attn_ops.takes_rope(cache, n, c.has_qk_norm, distinct):
            own = attn_ops.OwnKV(ws.k, ws.v, self.freq_factors[i], bias)
        else:
            qk_norm = (layer["attn_q_norm"], layer["attn_k_norm"], c.norm_eps) if c.has_qk_norm else None
            rope.rope_store_kv(rec, shape, ws.q, ws.k, ws.v, cache, step, n, self.freq_factors[i], qk_norm, bias)
            rec.barrier()
        # where the output product takes 8-bit input, attention writes it (its merge, in decode)
        w_out = layer["attn_output"]
        x8_out = product_path(rec.ctx, n, w_out.cols, qtype=w_out.ggml_type) in X8_PATHS
        attn_ops.attention(rec, shape, ws.q, cache, ws.att, step, n, ws.attention, sinks=layer.get("attn_sinks"),
                           x8=ws.x8 if x8_out else None, tiles=ws.attention_tiles, own=own)
        rec.barrier()
        after = None if c.n_expert or c.has_attn_out_bias else (layer[c.ffn_norm], [layer["ffn_gate"], layer["ffn_up"]])
        ready = self.record_residual(rec, ws, layer, "attn_output", Quantized(ws.x8) if x8_out else ws.att,
                                     "post_attention_norm", n, after)
        if c.has_attn_out_bias:
            elementwise.add_bias(rec, ws.x, layer["attn_output.bias"], n, c.n_embd)
            rec.barrier()
        return ready

    def record_residual(self, rec, ws, layer, weight, inp, post_norm, n, after=None):
        """x += W inp, or with post norms x += rms_norm(W inp) (through xb, free by then). `after`:
        the next norm's weight and the products of its output; where the product can write their
        input (folds_norm), it does, and that input is returned (else None)."""
        c = self.config
        if not c.has_post_norms:
            fold = (after is not None and ws.x8_norm is not None
                    and folds_norm(rec.ctx, layer[weight], after[1], n))
            next_norm = NormBlocks(ws.x8_norm, ws.done, after[0], c.norm_eps) if fold else None
            matmul(rec, layer[weight], inp, ws.x, n, y_accumulate=True, x8=ws.x8, next_norm=next_norm, xh=ws.xh)
            rec.barrier()
            return Quantized(ws.x8_norm, c.norm_eps) if fold else None
        matmul(rec, layer[weight], inp, ws.xb, n, x8=ws.x8, xh=ws.xh)
        rec.barrier()
        norm.rms_norm_add(rec, ws.xb, layer[post_norm], ws.x, n, c.n_embd, c.norm_eps)
        rec.barrier()
        return None

    def record_ffn(self, rec, ws, layer, n, ready=None, after=None):
        """The FFN block, x += its output; `ready` and `after` (the next norm's weight and the
        products of its output), and what it returns, as record_attention's and record_residual's."""
        c = self.config
        if c.n_expert:
            record_moe_ffn(rec, ws, layer, c, n)
            return None
        gate, up, down = layer["ffn_gate"], layer["ffn_up"], layer["ffn_down"]
        x_in, folded = (ready, None) if ready is not None else normed_input(
            rec, ws.x, layer[c.ffn_norm], ws.xb, n, c.n_embd, c.norm_eps, [gate, up], glu=True, x8=ws.x8, xh=ws.xh)
        # the SwiGLU's output in 8-bit blocks from the gate+up product itself where the down
        # product takes them (one column over 8-bit x), else quantized by the down product's
        # call; in f16 from the SwiGLU's dispatch where it takes the cooperative-matrix kernel
        down_path = product_path(rec.ctx, n, down.cols, qtype=down.ggml_type)
        blocks = (ws.x8_ffn is not None and not c.ffn_gelu and folded is None and writes_blocks(rec.ctx, gate, up, n)
                  and down_path == "mat_vec_x8")
        halves = matmul_swiglu(rec, gate, up, x_in, ws.gate, n, up=ws.up, gelu=c.ffn_gelu, norm=folded, x8=ws.x8,
                               blocks_out=BlocksOut(ws.x8_ffn, ws.done) if blocks else None, xh=ws.xh,
                               halves_out=down_path == "coopmat")
        rec.barrier()
        inp = halves or (Quantized(ws.x8_ffn) if blocks else ws.gate)
        return self.record_residual(rec, ws, layer, "ffn_down", inp, "post_ffw_norm", n, after)
