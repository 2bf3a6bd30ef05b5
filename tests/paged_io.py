"""Paged KV caches for kernel tests, built independently of the engine: each sequence's rows
[length, n_head_kv, head_dim] scattered over a shuffled block table into a pool whose other rows
hold poison (huge values, which break any result that reads them); 8-bit pools are made and
read back with gguf.quants' Q8_0 (llama.cpp's bit-exact q8_0)."""
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

from worker.engine.kernels.paged import Q8_GROUP, PagedCache

POISON = 3e4


def q8_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 values, f16 scales) of rows [..., width] as gguf's Q8_0 blocks."""
    blocks = quants.quantize(rows.reshape(-1, Q8_GROUP).astype(np.float32), T.Q8_0).reshape(-1, 34)
    return blocks[:, 2:].copy().view(np.int8).reshape(-1), blocks[:, :2].copy().view(np.float16).reshape(-1)


def q8_values(rows: np.ndarray) -> np.ndarray:
    """What an 8-bit cache holding `rows` gives back (float32, same shape)."""
    blocks = quants.quantize(rows.reshape(-1, Q8_GROUP).astype(np.float32), T.Q8_0)
    return quants.dequantize(blocks, T.Q8_0).reshape(rows.shape)


class Paged:
    """A pool of `n_blocks` blocks of `block` rows; sequence s owns blocks table[s, :] (a random
    permutation, so neighbouring positions are rarely neighbouring rows)."""

    def __init__(self, dev, rng, n_seqs: int, capacity: int, n_head_kv: int, head_dim: int, block: int = 16,
                 kv_type: str = "f16", spare_blocks: int = 3):
        self.dev, self.block, self.kv_type = dev, block, kv_type
        self.stride = -(-capacity // block)
        self.n_blocks = n_seqs * self.stride + spare_blocks
        self.table = rng.permutation(self.n_blocks)[:n_seqs * self.stride].reshape(n_seqs, self.stride).astype(np.uint32)
        self.width = n_head_kv * head_dim
        self.shape = (n_head_kv, head_dim)
        self.k = np.full((self.n_blocks * block, self.width), POISON, np.float32)
        self.v = np.full((self.n_blocks * block, self.width), -POISON, np.float32)

    def row(self, seq: int, pos: int) -> int:
        return int(self.table[seq, pos // self.block]) * self.block + pos % self.block

    def fill(self, seq: int, k: np.ndarray, v: np.ndarray, first: int = 0):
        """Positions first.. of sequence seq hold k, v [n, n_head_kv, head_dim]."""
        for i in range(len(k)):
            r = self.row(seq, first + i)
            self.k[r], self.v[r] = k[i].reshape(-1), v[i].reshape(-1)

    def cache(self) -> PagedCache:
        table = self.dev.host(self.table)
        if self.kv_type == "f16":
            return PagedCache(self.dev.put(self.k.astype(np.float16)), self.dev.put(self.v.astype(np.float16)),
                              table, self.block, self.stride)
        (kq, ks), (vq, vs) = q8_rows(self.k), q8_rows(self.v)
        return PagedCache(self.dev.put(kq), self.dev.put(vq), table, self.block, self.stride,
                          self.dev.put(ks), self.dev.put(vs))

    def empty_cache(self) -> PagedCache:
        """A cache whose pools hold zeros, for kernels that write into it."""
        table, rows = self.dev.host(self.table), self.n_blocks * self.block
        if self.kv_type == "f16":
            return PagedCache(self.dev.put(np.zeros((rows, self.width), np.float16)),
                              self.dev.put(np.zeros((rows, self.width), np.float16)), table, self.block, self.stride)
        zeros8, scales = np.zeros(rows * self.width, np.int8), np.zeros(rows * self.width // Q8_GROUP, np.float16)
        return PagedCache(self.dev.put(zeros8), self.dev.put(zeros8), table, self.block, self.stride,
                          self.dev.put(scales), self.dev.put(scales))

    def read(self, cache: PagedCache, which: str, seq: int, positions) -> np.ndarray:
        """Rows of sequence seq at `positions` back from the device, as float32 [n, n_head_kv, head_dim]."""
        rows = [self.row(seq, p) for p in positions]
        n_rows = self.n_blocks * self.block
        if self.kv_type == "f16":
            pool = self.dev.get(getattr(cache, which), np.float16, n_rows * self.width).reshape(n_rows, self.width)
            return pool[rows].astype(np.float32).reshape(len(rows), *self.shape)
        q = self.dev.get(getattr(cache, which), np.int8, n_rows * self.width).reshape(n_rows, self.width)
        scales = self.dev.get(getattr(cache, f"{which}_scale"), np.float16, n_rows * self.width // Q8_GROUP)
        s = scales.reshape(n_rows, self.width // Q8_GROUP).astype(np.float32)
        return (q[rows].astype(np.float32).reshape(len(rows), -1, Q8_GROUP) * s[rows][..., None]).reshape(
            len(rows), *self.shape)

    def stored(self, values: np.ndarray) -> np.ndarray:
        """What the cache holds for values [n, n_head_kv, head_dim] (rounded to its type)."""
        if self.kv_type == "f16":
            return values.astype(np.float16).astype(np.float32)
        return q8_values(values)


def step_buffer(dev, tokens) -> object:
    """The step buffer of a pass: (slot, position) per token."""
    return dev.host(np.asarray(tokens, np.uint32).reshape(-1, 2))
