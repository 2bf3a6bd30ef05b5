"""The device memory a model needs, computed from the file before anything is uploaded, and
checked against the device's budget so a model that cannot fit fails with a useful message.

weights: every tensor's bytes as stored (weights stay in their GGUF blocks on the GPU).
kv: the paged KV cache's pool (worker/engine/kvcache.py), K and V for every layer, of kv_tokens
    positions in all: 2 * n_layer * kv_tokens * n_head_kv * head_dim * 2 bytes in f16, a little
    over half that in q8_0. One sequence of n_ctx positions must fit; the pool then grows, with
    what the budget leaves, towards `sequences` full contexts (sequences that use less leave
    room for more).
scratch: the runner's Workspace for passes of one prefill chunk with logits rows for `sequences`
    sequences (worker/engine/workspace.py: float32 activations, logits, step values and sampler
    readbacks, and, when the caller knows the device, the kernels' scratch): the same sizes it
    allocates. Attention kernels stream over the cache, so the activations do not grow with the
    context.
"""
from dataclasses import dataclass

from vkllm.errors import VkllmError
from worker.engine.kvblocks import BLOCK_TOKENS
from worker.engine.kvcache import block_bytes
from worker.engine.workspace import Workspace

PREFILL_CHUNK = 512
POOL_SHARE = 0.9   # of the budget left after one context, what the KV pool may take beyond it


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
    kv_tokens: int = 0       # positions the KV pool holds, all sequences together
    sequences: int = 1       # sequences decoded together
    kv_type: str = "f16"

    @classmethod
    def compute(cls, model_file, config, n_ctx: int, chunk: int = PREFILL_CHUNK,
                kernel_scratch: int = 0, sequences: int = 1, kv_type: str = "f16",
                kv_tokens: int | None = None) -> "MemoryPlan":
        """`kernel_scratch`: bytes of the kernels' own scratch (Workspace.kernel_sizes), which
        depend on the device; `kv_tokens`: the pool's positions (default one context), rounded
        up to whole blocks."""
        c = config
        per_token = block_bytes(c, kv_type) // BLOCK_TOKENS
        kv_tokens = -(-(kv_tokens or n_ctx) // BLOCK_TOKENS) * BLOCK_TOKENS
        return cls(n_ctx=n_ctx,
                   weights_bytes=sum(t.n_bytes for t in model_file.tensors.values()),
                   kv_bytes=per_token * kv_tokens,
                   scratch_bytes=sum(Workspace.sizes(c, chunk, sequences).values()) + kernel_scratch,
                   kv_bytes_per_token=per_token, kv_tokens=kv_tokens, sequences=sequences, kv_type=kv_type)

    @property
    def kv_blocks(self) -> int:
        return self.kv_tokens // BLOCK_TOKENS

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
        return {"n_ctx": self.n_ctx, "weights_bytes": self.weights_bytes,
                "kv_bytes": self.kv_bytes, "scratch_bytes": self.scratch_bytes,
                "total_bytes": self.total, "kv_tokens": self.kv_tokens, "sequences": self.sequences}


def plan_context(model_file, config, requested: int | None, default: int, chunk: int,
                 budget_bytes: int, kernel_scratch=lambda n_ctx: 0, sequences: int = 1,
                 kv_type: str = "f16", max_kv_tokens: int | None = None) -> MemoryPlan:
    """The plan to load with. An explicit context is checked as asked; without one, the context
    is the default capped by the model's own and, when that does not fit, by the largest that
    does. `kernel_scratch(n_ctx)`: bytes of the kernels' scratch at that context. Raises what
    `check` raises when nothing fits. The KV pool then takes up to `sequences` contexts of what
    the budget leaves (and at most max_kv_tokens, the device's binding range); `sequences` is
    capped by the pool's blocks (each sequence holds one at least)."""
    def compute(n_ctx, kv_tokens=None, seqs=sequences):
        return MemoryPlan.compute(model_file, config, n_ctx, chunk, kernel_scratch(n_ctx), seqs, kv_type, kv_tokens)

    n_ctx = min(requested or default, config.context_length)
    plan = compute(n_ctx)
    if requested is None and plan.total > budget_bytes and plan.largest_context(budget_bytes) > 0:
        n_ctx = min(n_ctx, plan.largest_context(budget_bytes))
        plan = compute(n_ctx)
    plan.check(budget_bytes)
    room = int((budget_bytes - plan.total) * POOL_SHARE) // plan.kv_bytes_per_token
    kv_tokens = plan.kv_tokens + min((sequences - 1) * n_ctx, room)
    if max_kv_tokens is not None:
        kv_tokens = max(plan.kv_tokens, min(kv_tokens, max_kv_tokens // BLOCK_TOKENS * BLOCK_TOKENS))
    kv_tokens = kv_tokens // BLOCK_TOKENS * BLOCK_TOKENS
    return compute(n_ctx, kv_tokens, min(sequences, kv_tokens // BLOCK_TOKENS))
