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

The chunk is chosen here too (`plan_load`): on matrix units a 512-token chunk leaves the narrow
projections' mat-mats short of workgroups, so bigger chunks are taken where they cost no context
and their scratch stays a small share of the budget; the KV pool then takes what is left.

A model split across devices (worker/engine/placement.py) has a plan per device (`plan_split`):
its layers' weights and KV cache, the embedding table on the first, the output norm and head on
the last, and a whole workspace on each (plus the hidden state's hand-off buffer), each against
that device's budget; context, chunk and pool size are the same on all (a block id names the
same positions in every layer), so the device with the least room decides them.
"""
import logging
import re
from dataclasses import dataclass

from vkllm.errors import VkllmError
from worker.engine.kvblocks import BLOCK_TOKENS
from worker.engine.kvcache import block_bytes
from worker.engine.workspace import Workspace

log = logging.getLogger(__name__)

PREFILL_CHUNK = 512
# A CPU driver (lavapipe) prefills at one rate whatever the chunk (SmolLM2-135M, 512 tokens on
# 2 cores: 21.6 tok/s in chunks of 512, 22.0 of 128, 20.8 of 64, 22.5 of 32), so it takes small
# ones: a batch step that prefills a chunk holds every streaming sequence for it (24 s at 512),
# and a cancelled prompt stops at the end of its chunk.
CPU_PREFILL_CHUNK = 32
# Chunks tried, smallest first, on devices with matrix units (cooperative matrices); other GPUs
# keep PREFILL_CHUNK, which already fills the scalar tiled kernel.
MATRIX_UNIT_CHUNKS = (512, 1024, 2048)
SCRATCH_SHARE = 1 / 16   # of the budget, at most, for a chunk beyond the first
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
    chunk: int = PREFILL_CHUNK   # tokens per prefill pass, which the scratch is sized for
    kv_tokens: int = 0       # positions the KV pool holds, all sequences together
    sequences: int = 1       # sequences decoded together
    kv_type: str = "f16"
    layers: range | None = None   # a split model's: the layers of this plan's device

    @classmethod
    def compute(cls, model_file, config, n_ctx: int, chunk: int = PREFILL_CHUNK,
                kernel_scratch: int = 0, sequences: int = 1, kv_type: str = "f16",
                kv_tokens: int | None = None, layers: range | None = None, first: bool = True,
                last: bool = True) -> "MemoryPlan":
        """`kernel_scratch`: bytes of the kernels' own scratch (Workspace.kernel_sizes), which
        depend on the device; `kv_tokens`: the pool's positions (default one context), rounded
        up to whole blocks. A split model's device holds `layers` and is the `first` or `last`
        of the split or neither (stage_weight_bytes); the default is the whole model."""
        c = config
        staged = layers is not None and not (first and last)
        layers = range(c.n_layer) if layers is None else layers
        per_token = block_bytes(c, kv_type, len(layers)) // BLOCK_TOKENS
        kv_tokens = -(-(kv_tokens or n_ctx) // BLOCK_TOKENS) * BLOCK_TOKENS
        return cls(n_ctx=n_ctx,
                   weights_bytes=stage_weight_bytes(model_file, layers, first, last),
                   kv_bytes=per_token * kv_tokens,
                   scratch_bytes=sum(Workspace.sizes(c, chunk, sequences, staged).values()) + kernel_scratch,
                   kv_bytes_per_token=per_token, chunk=chunk, kv_tokens=kv_tokens, sequences=sequences,
                   kv_type=kv_type, layers=layers if staged else None)

    @property
    def kv_blocks(self) -> int:
        return self.kv_tokens // BLOCK_TOKENS

    @property
    def total(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.scratch_bytes

    def largest_context(self, budget_bytes: int) -> int:
        """Largest n_ctx (a multiple of 256) whose plan fits the budget; 0 if none does."""
        free = budget_bytes - self.weights_bytes - self.scratch_bytes
        if not self.kv_bytes_per_token:   # a device of a split that holds no layer
            return NO_LIMIT if free >= 0 else 0
        return max(0, free // self.kv_bytes_per_token // 256 * 256)

    def check(self, budget_bytes: int, fits: int | None = None, where: str = "") -> None:
        """Raise VkllmError saying what would fit when the plan exceeds budget_bytes. `fits`: the
        largest context (default: this plan's); `where`: the device, in a split."""
        if self.total <= budget_bytes:
            return
        fits = self.largest_context(budget_bytes) if fits is None else fits
        need = (f"needs {human_bytes(self.total)} (weights {human_bytes(self.weights_bytes)}, KV cache "
                f"{human_bytes(self.kv_bytes)} for {self.n_ctx} tokens, scratch {human_bytes(self.scratch_bytes)})"
                f" but the device budget is {human_bytes(budget_bytes)}")
        if fits == 0:
            raise VkllmError(f"model does not fit: {where}it {need}; the weights alone leave no room "
                             "for a context, use a smaller quantization or a bigger device")
        raise VkllmError(f"model does not fit: {where}it {need}; the largest context that fits is "
                         f"{fits} tokens")

    def describe(self) -> dict[str, int]:
        layers = {} if self.layers is None else {"layers": [self.layers.start, self.layers.stop]}
        return {"n_ctx": self.n_ctx, "chunk": self.chunk, "weights_bytes": self.weights_bytes,
                "kv_bytes": self.kv_bytes, "scratch_bytes": self.scratch_bytes,
                "total_bytes": self.total, "kv_tokens": self.kv_tokens, "sequences": self.sequences, **layers}


NO_LIMIT = 1 << 62


def layer_shares(model_file, budgets: list[int]) -> list[int]:
    """What each device of a split has for layers, in proportion to which they are placed when no
    split is asked for: its budget less the tensors outside the layers that it holds (the
    embeddings on the first, the output on the last). Where none has room for a layer, equal
    shares: the memory plan then refuses the model, saying what it needs and what fits."""
    n = len(budgets)
    shares = [max(0, budget - stage_weight_bytes(model_file, range(0), i == 0, i == n - 1))
              for i, budget in enumerate(budgets)]
    return shares if any(shares) else [1] * n


def layer_range(layers: range) -> str:
    return f"layers {layers.start}-{layers.stop - 1}" if layers else "no layers"
_LAYER = re.compile(r"blk\.(\d+)\.")


def stage_weight_bytes(model_file, layers: range, first: bool, last: bool) -> int:
    """Bytes of the tensors a device holds (models/model.py places them): its layers', the
    embedding table on the first, every other global tensor on the last (and a tied
    embedding table there too, its output head)."""
    tensors, total = model_file.tensors, 0
    tied = "output.weight" not in tensors
    for name, t in tensors.items():
        match = _LAYER.match(name)
        if match:
            held = int(match.group(1)) in layers
        elif name == "token_embd.weight":
            held = first or (last and tied)
        else:
            held = last
        total += t.n_bytes if held else 0
    return total


def plan_context(model_file, config, requested: int | None, default: int, chunk: int,
                 budget_bytes: int, kernel_scratch=lambda n_ctx: 0, sequences: int = 1,
                 kv_type: str = "f16", max_kv_tokens: int | None = None) -> MemoryPlan:
    """plan_load with one chunk size; `kernel_scratch(n_ctx)`: bytes of the kernels' scratch."""
    return plan_load(model_file, config, requested, default, (chunk,), budget_bytes,
                     lambda _chunk, n_ctx: kernel_scratch(n_ctx), sequences, kv_type, max_kv_tokens)


def plan_load(model_file, config, requested: int | None, default: int, chunks: tuple[int, ...],
              budget_bytes: int, kernel_scratch=lambda chunk, n_ctx: 0, sequences: int = 1,
              kv_type: str = "f16", max_kv_tokens: int | None = None) -> MemoryPlan:
    """plan_split on one device."""
    return plan_split(model_file, config, requested, default, chunks, [budget_bytes], [None], kernel_scratch,
                      sequences, kv_type, max_kv_tokens)[0]


def check_split(plans: list[MemoryPlan], budgets: list[int]) -> None:
    """Raise what MemoryPlan.check raises for the first device whose plan exceeds its budget,
    naming the largest context that fits every device."""
    fits = min(plan.largest_context(budget) for plan, budget in zip(plans, budgets))
    for i, (plan, budget) in enumerate(zip(plans, budgets)):
        where = "" if plan.layers is None else f"on device {i} of the split ({layer_range(plan.layers)}) "
        plan.check(budget, fits, where)


def plan_split(model_file, config, requested: int | None, default: int, chunks: tuple[int, ...],
               budgets: list[int], ranges: list, kernel_scratch=lambda chunk, n_ctx: 0, sequences: int = 1,
               kv_type: str = "f16", max_kv_tokens: int | None = None,
               pool_share: float = POOL_SHARE) -> list[MemoryPlan]:
    """The plans to load with, one per device of `budgets`, holding the layers of `ranges` (one
    device: [None], the whole model); context, chunk and pool are the same on every device,
    limited by all. An explicit context is checked as asked (the model's own where it asks more,
    with a warning); without one, the context
    is the default capped by the model's own and, when that does not fit, by the largest that
    does (with the first of `chunks`, ascending). Raises what `check_split` raises when nothing
    fits. Then the largest later chunk, up to the context, whose plans keep that context within
    the budgets with their scratch at most SCRATCH_SHARE of each. `kernel_scratch(chunk, n_ctx)`:
    bytes of the kernels' scratch. The KV pool then takes up to `sequences` contexts, within
    `pool_share` of what the budgets leave (and at most max_kv_tokens, the devices' binding range);
    `sequences` is capped by the pool's blocks (each sequence holds one at least)."""
    def compute(n_ctx, chunk, kv_tokens=None, seqs=sequences):
        return [MemoryPlan.compute(model_file, config, n_ctx, chunk, kernel_scratch(chunk, n_ctx), seqs, kv_type,
                                   kv_tokens, layers, i == 0, i == len(ranges) - 1)
                for i, layers in enumerate(ranges)]

    def fits(plans):
        return all(plan.total <= budget for plan, budget in zip(plans, budgets))

    def largest(plans):
        return min(plan.largest_context(budget) for plan, budget in zip(plans, budgets))

    chunk = chunks[0]
    n_ctx = min(requested or default, config.context_length)
    if requested is not None and requested > config.context_length:   # llama.cpp warns too
        log.warning("a context of %d positions was asked; the model was trained for %d and takes that",
                    requested, config.context_length)
    plans = compute(n_ctx, chunk)
    if requested is None and not fits(plans) and largest(plans) > 0:
        n_ctx = min(n_ctx, largest(plans))
        plans = compute(n_ctx, chunk)
    check_split(plans, budgets)
    for bigger_chunk in chunks[1:]:
        if bigger_chunk > n_ctx:
            break
        bigger = compute(n_ctx, bigger_chunk)
        if not fits(bigger) or any(plan.scratch_bytes > budget * SCRATCH_SHARE
                                   for plan, budget in zip(bigger, budgets)):
            break
        plans, chunk = bigger, bigger_chunk
    room = min(int((budget - plan.total) * pool_share) // plan.kv_bytes_per_token
               for plan, budget in zip(plans, budgets) if plan.kv_bytes_per_token)
    kv_tokens = plans[0].kv_tokens + min((sequences - 1) * n_ctx, room)
    if max_kv_tokens is not None:
        kv_tokens = max(plans[0].kv_tokens, min(kv_tokens, max_kv_tokens // BLOCK_TOKENS * BLOCK_TOKENS))
    kv_tokens = kv_tokens // BLOCK_TOKENS * BLOCK_TOKENS
    return compute(n_ctx, chunk, kv_tokens, min(sequences, kv_tokens // BLOCK_TOKENS))
