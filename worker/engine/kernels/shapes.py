"""The shapes that attention-side kernels (rope.py's rope_store_kv, attention.py) take as one
object instead of long argument lists, and the limits other modules size buffers by. No Vulkan
here: the memory plan reads it without a device."""
from dataclasses import dataclass

MAX_K = 64   # top-k candidates select.py's kernel keeps for the sampler


@dataclass(frozen=True)
class AttentionShape:
    """A model's attention geometry: query and KV heads of head_dim values, sequences of up to
    n_ctx positions in the KV cache (rows of [n_head_kv, head_dim]), RoPE over the first
    rope_dim values of a head (llama.cpp's normal or NeoX pairing), the score scale
    (head_dim^-0.5 unless given) and the sliding window (window > 0: a query at position i sees
    only positions > i - window)."""
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ctx: int
    rope_dim: int | None = None      # None: the whole head
    rope_base: float = 10000.0
    rope_neox: bool = False
    scale: float | None = None
    window: int = 0

    def __post_init__(self):
        if self.rope_dim is None:
            object.__setattr__(self, "rope_dim", self.head_dim)
        if self.scale is None:
            object.__setattr__(self, "scale", self.head_dim ** -0.5)
        if self.n_head % self.n_head_kv or self.head_dim % 4 or self.rope_dim % 2 or self.rope_dim > self.head_dim:
            raise ValueError(f"unsupported attention shape {self}")

    @classmethod
    def from_config(cls, config, n_ctx: int, layer: int | None = None) -> "AttentionShape":
        """From a models.config.ModelConfig, for sequences of up to n_ctx positions; with `layer`, that layer's
        RoPE base, score scale (YaRN's mscale folded in) and sliding window (the geometry is the same
        for every layer)."""
        if layer is None:
            return cls(config.n_head, config.n_head_kv, config.head_dim, n_ctx, config.rope_dim, config.rope_base,
                       config.rope_neox, config.attention_scale)
        local = config.is_sliding(layer)
        return cls(config.n_head, config.n_head_kv, config.head_dim, n_ctx, config.rope_dim,
                   config.rope_base_swa if local else config.rope_base, config.rope_neox,
                   config.layer_attention_scale(layer),
                   window=config.sliding_window if local else 0)

    @property
    def group(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.n_head // self.n_head_kv

    @property
    def kv_width(self) -> int:
        """Values in one row of a KV cache."""
        return self.n_head_kv * self.head_dim
