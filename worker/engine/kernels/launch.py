"""Launch shapes and scratch memory shared by the activation kernels (elementwise, norm, rope,
attention, select)."""
from weakref import WeakKeyDictionary

from worker.engine.vk.memory import Buffer

_scratch: WeakKeyDictionary = WeakKeyDictionary()


def threads(ctx) -> int:
    """Workgroup size for streaming and row-reduction kernels: eight subgroups (64 invocations on
    lavapipe, 256 on NVIDIA), which keeps reduce.glsl's subgroup count well under its 64."""
    return min(8 * ctx.info.subgroup_size, 1024)


def stride_groups(ctx, n: int, group_size: int) -> int:
    """Workgroups for a grid-stride loop over n items: one item per invocation up to the
    dispatch limit, beyond which each invocation takes several."""
    return max(1, min(-(-n // group_size), ctx.info.max_workgroup_count, 65535))


def scratch(ctx, name: str, nbytes: int) -> Buffer:
    """A device buffer of at least nbytes kept per context and name for intermediate results
    inside one op (split attention partials, top-k candidates). Ops that use the same name share
    it, so they must be ordered by barriers, as dependent layers are. A request larger than the
    current buffer gets a new one; the old stays alive for recordings that still refer to it."""
    buffers = _scratch.setdefault(ctx, {})
    held = buffers.get(name)
    if held is None or held[-1].size < nbytes:
        held = buffers.setdefault(name, [])
        held.append(ctx.alloc(nbytes))
    return held[-1]
