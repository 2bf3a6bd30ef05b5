"""Runs a model's recorded forward passes: prefill in chunks, decode by replaying one command
buffer per token. Per token the host writes the step buffer and token id, submits, waits, and
reads back either the GPU argmax (4 bytes) or the logits."""
from collections import OrderedDict

import numpy as np

from worker.kernels.select import argmax

_MAX_RECORDINGS = 6  # prefill recordings kept per model (one per distinct chunk length)


class Runner:
    def __init__(self, model):
        self.model, self.ctx = model, model.ctx
        vocab = model.config.vocab_size
        self.logits = self.ctx.alloc_host(4 * vocab)
        self.best = self.ctx.alloc_host(4)
        self.decode_recording = self._record(1)
        self._prefill: OrderedDict[int, object] = OrderedDict()

    def _record(self, n: int, logits=None, profile: bool = False):
        rec = self.ctx.recording(max_timestamps=2, profile=profile)
        if not profile:
            rec.timestamp("start")
        self.model.record_forward(rec, n, logits or self.logits, all_logits=logits is not None)
        if logits is None:
            rec.barrier()
            argmax(rec, self.logits, self.best, 1, self.model.config.vocab_size)
        if not profile:
            rec.timestamp("forward")
        return rec.finish()

    def _run(self, rec, ids, pos0: int):
        n = len(ids)
        self.model.scratch.ids.view(np.uint32)[:n] = ids
        self.model.step.view(np.uint32)[:2] = (pos0, n)
        self.ctx.run(rec)

    def prefill(self, ids, pos0: int, chunk: int):
        """Runs ids (at positions pos0..) through the model; logits of the last one stay in self.logits."""
        for start in range(0, len(ids), chunk):
            part = ids[start:start + chunk]
            self._run(self._prefill_recording(len(part)), part, pos0 + start)

    def _prefill_recording(self, n: int):
        if n == 1:
            return self.decode_recording
        if n not in self._prefill:
            if len(self._prefill) >= _MAX_RECORDINGS:
                self._prefill.popitem(last=False)[1].destroy()
            self._prefill[n] = self._record(n)
        self._prefill.move_to_end(n)
        return self._prefill[n]

    def decode(self, token: int, pos: int):
        self._run(self.decode_recording, [token], pos)

    def last_decode_gpu_seconds(self) -> float:
        return self.decode_recording.timings_ns()[0][1] * 1e-9

    def read_logits(self) -> np.ndarray:
        return self.logits.view(np.float32)

    def read_argmax(self) -> int:
        return int(self.best.view(np.uint32)[0])

    def all_logits(self, ids, pos0: int = 0) -> np.ndarray:
        """Logits for every position of one chunk (tests compare them with a reference)."""
        n, vocab = len(ids), self.model.config.vocab_size
        out = self.ctx.alloc_host(4 * n * vocab)
        rec = self._record(n, logits=out)
        self._run(rec, ids, pos0)
        result = out.view(np.float32)[:n * vocab].reshape(n, vocab).copy()
        rec.destroy()
        self.ctx.free(out)
        return result

    def profile(self, n: int, pos0: int = 0) -> dict[str, tuple[int, float]]:
        """GPU time of one forward pass over n tokens by kernel: name -> (dispatches, ns)."""
        rec = self._record(n, profile=True)
        self._run(rec, [0] * n, pos0)
        table: dict[str, tuple[int, float]] = {}
        for label, ns in rec.timings_ns():
            count, total = table.get(label, (0, 0.0))
            table[label] = (count + 1, total + ns)
        rec.destroy()
        return table

    def close(self):
        self.decode_recording.destroy()
        for rec in self._prefill.values():
            rec.destroy()
        self._prefill.clear()
