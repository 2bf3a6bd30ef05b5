"""Vulkan runtime: device choice, memory, pipelines, recorded command buffers. No Flask, no RQ."""
from worker.vk.context import Context
from worker.vk.loader import VulkanUnavailable

__all__ = ["Context", "VulkanUnavailable", "device_budget"]


def device_budget(settings) -> tuple[int, int]:
    """(used, total) device-local bytes of the device `settings` selects."""
    ctx = Context(settings)
    try:
        return ctx.memory_budget()
    finally:
        ctx.close()
