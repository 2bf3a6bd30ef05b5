"""Vulkan runtime: device choice, memory, pipelines, recorded command buffers. No Flask, no RQ.

Importing this package does not load libvulkan (so the CLI can start, and say what is missing,
on a machine without it); `Context` and `device_budget` load it on first use."""

__all__ = ["Context", "device_budget"]


def __getattr__(name):
    if name == "Context":
        from worker.vk.context import Context
        return Context
    raise AttributeError(f"module 'worker.vk' has no attribute {name!r}")


def device_budget(settings) -> tuple[int, int]:
    """(used, total) device-local bytes of the device `settings` selects."""
    from worker.vk.context import Context
    ctx = Context(settings)
    try:
        return ctx.memory_budget()
    finally:
        ctx.close()
