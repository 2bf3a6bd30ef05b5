"""The device memory a model needs, computed from the file before anything is uploaded, and
checked against the device's budget so a model that cannot fit fails with a useful message.

weights: every tensor's bytes as stored (weights stay in their GGUF blocks on the GPU).
kv: f16 K and V for every layer and context position: 2 * n_layer * n_ctx * n_head_kv *
    head_dim * 2 bytes.
scratch: the runner's Workspace for passes of one prefill chunk (worker/engine/workspace.py:
    float32 activations, the last token's logits, step values and sampler readbacks, and, when the
    caller knows the device, the kernels' scratch): the same sizes it allocates. Attention kernels
    stream over the cache, so the activations do not grow with the context.

The chunk itself is chosen here too (`plan_load`): on matrix units a 512-token chunk leaves the
narrow projections' mat-mats short of workgroups, so bigger chunks are taken where they cost no
context and their scratch stays a small share of the budget.
"""
from dataclasses import dataclass

from vkllm.errors import VkllmError
from worker.engine.workspace import Workspace

PREFILL_CHUNK = 512
# Chunks tried, smallest first, on devices with matrix units (cooperative matrices); others keep
# PREFILL_CHUNK, which already fills the scalar tiled kernel.
MATRIX_UNIT_CHUNKS = (512, 1024, 2048)
SCRATCH_SHARE = 1 / 16   # of the budget, at most, for a chunk beyond the first
KV_BYTES = 2          # f16


def human_bytes(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class MemoryPlan:
    n_ctx: int
    weights_bytes: int
    kv_bytes: int
    scratch_bytes: int
    kv_bytes_per_token: int
    chunk: int = PREFILL_CHUNK   # tokens per prefill pass, which the scratch is sized for

    @classmethod
    def compute(cls, model_file, config, n_ctx: int, chunk: int = PREFILL_CHUNK,
                kernel_scratch: int = 0) -> "MemoryPlan":
        """`kernel_scratch`: bytes of the kernels' own scratch (Workspace.kernel_sizes), which
        depend on the device."""
        c = config
        per_token = 2 * c.n_layer * c.n_head_kv * c.head_dim * KV_BYTES
        return cls(n_ctx=n_ctx,
                   weights_bytes=sum(t.n_bytes for t in model_file.tensors.values()),
                   kv_bytes=per_token * n_ctx,
                   scratch_bytes=sum(Workspace.sizes(c, chunk).values()) + kernel_scratch,
                   kv_bytes_per_token=per_token, chunk=chunk)

    @property
    def total(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.scratch_bytes

    def largest_context(self, budget_bytes: int) -> int:
        """Largest n_ctx (a multiple of 256) whose plan fits the budget; 0 if none does."""
        free = budget_bytes - self.weights_bytes - self.scratch_bytes
        return max(0, free // self.kv_bytes_per_token // 256 * 256)

    def check(self, budget_bytes: int) -> None:
        """Raise VkllmError saying what would fit when the plan exceeds budget_bytes."""
        if self.total <= budget_bytes:
            return
        fits = self.largest_context(budget_bytes)
        need = (f"needs {human_bytes(self.total)} (weights {human_bytes(self.weights_bytes)}, KV cache "
                f"{human_bytes(self.kv_bytes)} for {self.n_ctx} tokens, scratch {human_bytes(self.scratch_bytes)})"
                f" but the device budget is {human_bytes(budget_bytes)}")
        if fits == 0:
            raise VkllmError(f"model does not fit: it {need}; the weights alone leave no room "
                             "for a context, use a smaller quantization or a bigger device")
        raise VkllmError(f"model does not fit: it {need}; the largest context that fits is "
                         f"{fits} tokens")

    def describe(self) -> dict[str, int]:
        return {"n_ctx": self.n_ctx, "chunk": self.chunk, "weights_bytes": self.weights_bytes,
                "kv_bytes": self.kv_bytes, "scratch_bytes": self.scratch_bytes,
                "total_bytes": self.total}


def plan_context(model_file, config, requested: int | None, default: int, chunk: int,
                 budget_bytes: int, kernel_scratch=lambda n_ctx: 0) -> MemoryPlan:
    """The plan to load with. An explicit context is checked as asked; without one, the context
    is the default capped by the model's own and, when that does not fit, by the largest that
    does. `kernel_scratch(n_ctx)`: bytes of the kernels' scratch at that context. Raises what
    `check` raises when nothing fits."""
    n_ctx = min(requested or default, config.context_length)
    plan = MemoryPlan.compute(model_file, config, n_ctx, chunk, kernel_scratch(n_ctx))
    if requested is None and plan.total > budget_bytes and plan.largest_context(budget_bytes) > 0:
        n_ctx = min(n_ctx, plan.largest_context(budget_bytes))
        plan = MemoryPlan.compute(model_file, config, n_ctx, chunk, kernel_scratch(n_ctx))
    plan.check(budget_bytes)
    return plan


def plan_load(model_file, config, requested: int | None, default: int, chunks: tuple[int, ...],
              budget_bytes: int, kernel_scratch=lambda chunk, n_ctx: 0) -> MemoryPlan:
    """plan_context with the first of `chunks` (ascending), then the largest later chunk, up to
    the context, whose plan keeps that context within the budget with its scratch at most
    SCRATCH_SHARE of it. `kernel_scratch(chunk, n_ctx)`: bytes of the kernels' scratch."""
    first = chunks[0]
    plan = plan_context(model_file, config, requested, default, first, budget_bytes,
                        lambda n_ctx: kernel_scratch(first, n_ctx))
    for chunk in chunks[1:]:
        if chunk > plan.n_ctx:
            break
        bigger = MemoryPlan.compute(model_file, config, plan.n_ctx, chunk, kernel_scratch(chunk, plan.n_ctx))
        if bigger.total > budget_bytes or bigger.scratch_bytes > budget_bytes * SCRATCH_SHARE:
            break
        plan = bigger
    return plan
