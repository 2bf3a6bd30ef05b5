"""One layer of the paged KV cache as the attention-side kernels bind it (shaders/kv_cache.glsl):
K and V pools of rows [n_head_kv * head_dim] in blocks of `block` rows, the block table (uint32
[slots, table_stride], host-visible, written by the engine before each pass) that maps a
sequence's positions to rows, and with 8-bit KV the per-32-value f16 scales. No Vulkan here."""
from dataclasses import dataclass

Q8_GROUP = 32   # values per scale of the 8-bit cache (kv_cache.glsl's KV_Q8_GROUP)
KV_TYPES = ("f16", "q8_0")


@dataclass(frozen=True)
class PagedCache:
    k: object            # Buffer: f16 or int8 values
    v: object
    table: object        # Buffer: uint32 block table
    block: int           # rows per block
    table_stride: int    # blocks per sequence in the table
    k_scale: object = None   # Buffer: f16 [rows * width / Q8_GROUP] when 8-bit
    v_scale: object = None

    @property
    def q8(self) -> bool:
        return self.k_scale is not None

    @property
    def suffix(self) -> str:
        """The kernel variant's name suffix (variants.toml)."""
        return "_q8" if self.q8 else ""

    @property
    def scales(self) -> list:
        """Buffers bound after a kernel's others (the 8-bit scales), none for f16."""
        return [self.k_scale, self.v_scale] if self.q8 else []


def row_bytes(kv_type: str, width: int) -> int:
    """Bytes of one cache row of `width` values (K or V) in `kv_type`, scales included."""
    if kv_type == "f16":
        return 2 * width
    if kv_type == "q8_0":
        return width + 2 * (width // Q8_GROUP)
    raise ValueError(f"unknown KV cache type {kv_type!r}")
