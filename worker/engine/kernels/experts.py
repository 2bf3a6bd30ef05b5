"""A mixture-of-experts FFN's kernels: routing, the mat-vecs over the chosen experts' rows and
the weighted sum into the residual. Each function records its dispatches without barriers, as
matmul.py's do.

A slot is one (token t, its j-th chosen expert), numbered t * n_used + j; `route` writes each
slot's expert id and weight on the GPU and the expert mat-vecs read the ids there, so nothing
goes back to the host. Every slot is one column of mul_mat_vec.comp's EXPERTS variants, for
decode and prefill alike (a prefill token reads its experts' rows on its own: correct, not yet
grouped by expert for the mat-mat kernel)."""
from worker.engine.intmath import cdiv
from worker.engine.kernels.launch import stride_groups, threads
from worker.engine.kernels.matmul import mat_vec_shape
from worker.engine.kernels.tensor import DeviceTensor
from worker.engine.vk.commands import Recording
from worker.engine.vk.memory import Buffer

ROUTE_THREADS = 64


def route(rec: Recording, logits: Buffer, ids: Buffer, weights: Buffer, n: int, n_expert: int, n_used: int,
          softmax_chosen: bool, norm: bool):
    """logits f32 [n, n_expert] -> ids uint32 and weights f32 [n, n_used] (moe_route.comp)."""
    ctx = rec.ctx
    kernel = ctx.kernel("moe_route", {0: ROUTE_THREADS})
    x = min(n, ctx.info.max_workgroup_count)
    rec.dispatch(kernel, [logits, ids, weights], (x, cdiv(n, x), 1),
                 dict(n_expert=n_expert, n_used=n_used, softmax_chosen=int(softmax_chosen), norm=int(norm)))


def _dispatch(rec: Recording, kernel_name: str, w: DeviceTensor, buffers, n_slots: int, n_used: int,
              x_per_slot: bool, threads_rows: tuple[int, int]):
    """One dispatch per part of `w`; `buffers(part)`: the bindings of that part."""
    ctx = rec.ctx
    threads_per_group, rows_per_group = threads_rows
    kernel = ctx.kernel(kernel_name, {0: threads_per_group, 1: rows_per_group, 2: 1})
    per_expert = w.rows // w.experts
    row_groups = cdiv(per_expert, rows_per_group)
    x_groups = min(row_groups, ctx.info.max_workgroup_count)
    for part in w.parts:
        _, first, count = part
        rec.dispatch(kernel, buffers(part), (x_groups, cdiv(row_groups, x_groups), n_slots),
                     dict(ncols=w.cols, rows=per_expert, n=n_slots, y_offset=0, y_stride=per_expert, accumulate=0,
                          n_used=n_used, expert_first=first // per_expert, expert_count=count // per_expert,
                          x_per_slot=int(x_per_slot)))


def matmul_experts(rec: Recording, w: DeviceTensor, x: Buffer, y: Buffer, ids: Buffer, n_slots: int, n_used: int,
                   x_per_slot: bool, bias: Buffer | None = None):
    """y[z, r] = sum_k W[ids[z]][r, k] * x[c, k] (+ bias[ids[z], r]) for every slot z, with c = z
    (x_per_slot) or the slot's token z // n_used; y f32 [n_slots, rows per expert]."""
    name = f"mul_mat_vec_id{'_bias' if bias is not None else ''}_{w.ggml_type.name.lower()}"
    extra = [bias] if bias is not None else []
    _dispatch(rec, name, w, lambda part: [part[0], x, y, ids, *extra], n_slots, n_used, x_per_slot,
              mat_vec_shape(rec.ctx))


def matmul_experts_glu(rec: Recording, w_gate: DeviceTensor, w_up: DeviceTensor, x: Buffer, out: Buffer,
                       ids: Buffer, n_slots: int, n_used: int, biases: tuple[Buffer, Buffer] | None = None):
    """out[z, r] = silu(G x[t])[r] * (U x[t])[r] with G, U the gate and up of expert ids[z] and t
    the slot's token: the fused gate+up kernel over the chosen experts. With `biases` (the gate's
    and the up's, [n_expert, rows]) they are added first and the activation is gpt-oss's clamped
    SwiGLU. Both weights must have one type and shape (as a model file's always do)."""
    if (w_gate.ggml_type, w_gate.rows, w_gate.cols, w_gate.experts) != (w_up.ggml_type, w_up.rows, w_up.cols, w_up.experts):
        raise ValueError(f"expert gate ({w_gate.ggml_type.name} {w_gate.rows}x{w_gate.cols}) and up "
                         f"({w_up.ggml_type.name} {w_up.rows}x{w_up.cols}) differ")
    op = "glu_oai" if biases is not None else "glu"
    extra = list(biases) if biases is not None else []
    ups = {first: buffer for buffer, first, _ in w_up.parts}
    _dispatch(rec, f"mul_mat_vec_id_{op}_{w_gate.ggml_type.name.lower()}", w_gate,
              lambda part: [part[0], ups[part[1]], x, out, ids, *extra], n_slots, n_used, False,
              mat_vec_shape(rec.ctx))


def combine(rec: Recording, y: Buffer, weights: Buffer, x: Buffer, n: int, n_used: int, n_embd: int):
    """x[t] += sum_j weights[t, j] * y[t * n_used + j] (moe_combine.comp)."""
    size = threads(rec.ctx)
    rec.dispatch(rec.ctx.kernel("moe_combine", {0: size}), [y, weights, x],
                 (stride_groups(rec.ctx, n * n_embd, size), 1, 1), dict(n_embd=n_embd, n_used=n_used, n=n))
