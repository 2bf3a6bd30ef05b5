"""Which memory types a context's pools take (vk/memory.py choose_memory_type), on the layouts
drivers report: the weights' device-local type must be on the device's main heap, host-visible
where the host maps that (resizable BAR, integrated GPUs, CPU drivers), never the 256 MiB window
a GPU without resizable BAR maps for the host."""
import pytest

from vkllm.errors import VkllmError
from worker.engine.vk.memory import MemoryType, choose_memory_type

LOCAL, HOST, COHERENT, CACHED = 1, 2, 4, 8
GiB, MiB = 1 << 30, 1 << 20


def pools(types):
    """(device pool's type, host pool's type) as Context chooses them."""
    return (choose_memory_type(types, LOCAL, HOST | COHERENT, main_heap=True),
            choose_memory_type(types, HOST | COHERENT, CACHED))


# (name, memory types in the driver's order, (device pool's type, host pool's type))
LAYOUTS = [
    ("radv without resizable BAR",
     [MemoryType(LOCAL, 16 * GiB - 256 * MiB), MemoryType(HOST | COHERENT, 32 * GiB),
      MemoryType(LOCAL | HOST | COHERENT, 256 * MiB), MemoryType(HOST | COHERENT | CACHED, 32 * GiB)], (0, 3)),
    ("radv with resizable BAR",
     [MemoryType(LOCAL, 16 * GiB), MemoryType(HOST | COHERENT, 32 * GiB),
      MemoryType(LOCAL | HOST | COHERENT, 16 * GiB), MemoryType(HOST | COHERENT | CACHED, 32 * GiB)], (2, 3)),
    ("nvidia without resizable BAR",
     [MemoryType(0, 32 * GiB), MemoryType(LOCAL, 24 * GiB), MemoryType(HOST | COHERENT, 32 * GiB),
      MemoryType(HOST | COHERENT | CACHED, 32 * GiB), MemoryType(LOCAL | HOST | COHERENT, 246 * MiB)], (1, 3)),
    ("nvidia with resizable BAR, its mapped heap a little smaller",
     [MemoryType(0, 32 * GiB), MemoryType(LOCAL, 80 * GiB), MemoryType(HOST | COHERENT, 32 * GiB),
      MemoryType(HOST | COHERENT | CACHED, 32 * GiB), MemoryType(LOCAL | HOST | COHERENT, 79 * GiB)], (4, 3)),
    ("lavapipe", [MemoryType(LOCAL | HOST | COHERENT | CACHED, 24 * GiB)], (0, 0)),
]


@pytest.mark.parametrize("types, expected", [layout[1:] for layout in LAYOUTS], ids=[layout[0] for layout in LAYOUTS])
def test_weights_go_to_the_main_device_local_heap(types, expected):
    assert pools(types) == expected


def test_a_missing_type_is_an_error():
    with pytest.raises(VkllmError, match="no memory type"):
        choose_memory_type([MemoryType(HOST | COHERENT, GiB)], LOCAL)


def test_the_real_device_maps_its_pools(vk_ctx):
    """lavapipe's one heap is device-local and host-visible: both pools map their memory, and
    the host-written inputs take the device pool (Context.alloc_input)."""
    assert vk_ctx.device_pool.host_visible and vk_ctx.host_pool.host_visible
    buffer = vk_ctx.alloc_input(64)
    try:
        assert buffer.block in vk_ctx.device_pool.blocks
    finally:
        vk_ctx.free(buffer)
