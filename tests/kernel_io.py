"""Helpers for kernel tests: arrays onto the device, one recorded op run, results back."""
from contextlib import contextmanager

import numpy as np


@contextmanager
def own_context(settings, **options):
    """A Context of the test's own (smaller blocks or binding ranges, other upload paths), closed
    after; with the validation layer on (lavapipe), any validation error it saw fails the test.
    Without the layer (the GPU machine) the same tests run and check results only."""
    from worker.engine.vk.context import Context
    ctx = Context(settings, **options)
    try:
        yield ctx
        assert ctx.validation is None or ctx.validation.errors == [], "Vulkan validation errors"
    finally:
        ctx.close()


class Device:
    """Buffers allocated through it are freed at close(), so tests do not leak pool space."""

    def __init__(self, ctx):
        self.ctx, self.buffers = ctx, []

    def put(self, array: np.ndarray):
        buf = self.ctx.alloc(max(array.nbytes, 4))
        self.ctx.upload(buf, array)
        self.buffers.append(buf)
        return buf

    def host(self, array: np.ndarray):
        """A host-visible buffer (the step buffer), rewritten between replays."""
        buf = self.ctx.alloc_host(array.nbytes)
        self.ctx.upload(buf, array)
        self.buffers.append(buf)
        return buf

    def empty(self, nbytes: int):
        buf = self.ctx.alloc(nbytes)
        self.buffers.append(buf)
        return buf

    def run(self, record):
        """record(rec) records the op; the recording is run once and destroyed."""
        rec = self.ctx.recording()
        record(rec)
        self.ctx.run(rec.finish())
        rec.destroy()

    def get(self, buf, dtype=np.float32, count=None) -> np.ndarray:
        return self.ctx.download(buf, dtype, count)

    def close(self):
        for buf in self.buffers:
            self.ctx.free(buf)


def f32(rng, *shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)
