"""Where a model's layers run when it is split across several Vulkan contexts (`--devices 0,1`):
contiguous ranges of layers, one per context, in order, each layer's KV cache with it; the
embedding lookup runs on the first, the output norm and head on the last. Contexts may share one
physical device (the lavapipe tests run two or three on the one CPU device): nothing here or in
the code that reads a Stage assumes they differ. One context is the same code with one stage.
No Vulkan here: the memory plan of `vkllm models inspect` uses the ranges without a device."""
from dataclasses import dataclass
from typing import Sequence

from vkllm.errors import VkllmError


@dataclass(frozen=True, eq=False)
class Stage:
    ctx: object       # the Context (a device) this stage's buffers and recordings are on
    layers: range     # the layers it runs, contiguous
    index: int        # its place in the order the hidden state goes through
    count: int        # stages in all

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.count - 1


def split_layers(n_layer: int, weights: Sequence[float]) -> list[range]:
    """Contiguous ranges covering 0..n_layer-1 in order, their sizes proportional to `weights`
    (largest remainders get the layers rounding leaves over; a range may be empty when there are
    more weights than layers)."""
    if not weights or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise VkllmError(f"a layer split needs positive shares, not {list(weights)}")
    exact = [n_layer * w / sum(weights) for w in weights]
    sizes = [int(e) for e in exact]
    for i in sorted(range(len(exact)), key=lambda i: sizes[i] - exact[i])[:n_layer - sum(sizes)]:
        sizes[i] += 1
    ranges, start = [], 0
    for size in sizes:
        ranges.append(range(start, start + size))
        start += size
    return ranges


def shared_budgets(free: Sequence[int], devices: Sequence) -> list[int]:
    """Each context's budget: contexts on one physical device (equal entries of `devices`)
    share its free memory evenly, as they share the memory itself."""
    return [f // list(devices).count(d) for f, d in zip(free, devices)]


def stages(ctxs: Sequence, ranges: Sequence[range]) -> list[Stage]:
    assert len(ctxs) == len(ranges)
    return [Stage(ctx, layers, i, len(ctxs)) for i, (ctx, layers) in enumerate(zip(ctxs, ranges))]


def stage_of_layer(placement: Sequence[Stage], layer: int) -> Stage:
    return next(stage for stage in placement if layer in stage.layers)
