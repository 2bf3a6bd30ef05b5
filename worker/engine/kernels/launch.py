"""Launch shapes shared by the activation kernels (elementwise, norm, rope, attention, select)."""
from worker.engine.intmath import cdiv


def threads(ctx) -> int:
    """Workgroup size for streaming and row-reduction kernels: eight subgroups (64 invocations on
    lavapipe, 256 on NVIDIA), which keeps reduce.glsl's subgroup count well under its 64."""
    return min(8 * ctx.info.subgroup_size, 1024)


def stride_groups(ctx, n: int, group_size: int) -> int:
    """Workgroups for a grid-stride loop over n items: one item per invocation up to the
    dispatch limit, beyond which each invocation takes several."""
    return max(1, min(cdiv(n, group_size), ctx.info.max_workgroup_count, 65535))


def grid(ctx, count: int) -> tuple[int, int, int]:
    """`count` workgroups as a dispatch: x up to the device's limit, the rest in y (the kernel
    numbers its workgroup y * gl_NumWorkGroups.x + x and skips those past count)."""
    x = min(count, ctx.info.max_workgroup_count)
    return x, cdiv(count, x), 1
