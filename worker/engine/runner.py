"""Runs a model's recorded forward passes: prefill in chunks, decode by replaying one command
buffer per token. Per token the host writes the step buffer and token id, submits, waits, and
reads back what the sampler needs: the GPU argmax (4 bytes), the GPU top-k candidates, or, when
penalties must see every logit, the logits themselves."""
from collections import OrderedDict

import numpy as np

from worker.engine.kernels.select import MAX_K, argmax, topk

SELECTIONS = ("argmax", "topk", "logits")
_MAX_RECORDINGS = 8  # recordings kept per model, by (tokens per pass, selection)


class Runner:
    def __init__(self, model):
        self.model, self.ctx = model, model.ctx
        vocab = model.config.vocab_size
        self.logits = self.ctx.alloc_host(4 * vocab)
        self.best = self.ctx.alloc_host(4)
        self.top_ids, self.top_values = self.ctx.alloc_host(4 * MAX_K), self.ctx.alloc_host(4 * MAX_K)
        self._recordings: OrderedDict[tuple[int, str], object] = OrderedDict()
        self._last = None

    def _record(self, n: int, select: str, logits=None, profile: bool = False):
        rec = self.ctx.recording(max_timestamps=2, profile=profile)
        if not profile:
            rec.timestamp("start")
        self.model.record_forward(rec, n, logits or self.logits, all_logits=logits is not None)
        vocab = self.model.config.vocab_size
        if select != "logits":
            rec.barrier()
        if select == "argmax":
            argmax(rec, self.logits, self.best, 1, vocab, self.model.scratch.select)
        elif select == "topk":
            topk(rec, self.logits, self.top_ids, self.top_values, vocab, min(MAX_K, vocab),
                 self.model.scratch.select)
        if not profile:
            rec.timestamp("forward")
        return rec.finish()

    def _recording(self, n: int, select: str):
        key = (n, select)
        if key not in self._recordings:
            if len(self._recordings) >= _MAX_RECORDINGS:
                self._recordings.popitem(last=False)[1].destroy()
            self._recordings[key] = self._record(n, select)
        self._recordings.move_to_end(key)
        return self._recordings[key]

    def _run(self, rec, ids, pos0: int):
        n = len(ids)
        self.model.scratch.ids.view(np.uint32)[:n] = ids
        self.model.step.view(np.uint32)[:2] = (pos0, n)
        self.ctx.run(rec)
        self._last = rec

    def prefill(self, ids, pos0: int, chunk: int, select: str = "argmax"):
        """Runs ids (at positions pos0..) through the model; the last one's logits are selected."""
        for start in range(0, len(ids), chunk):
            part = ids[start:start + chunk]
            last = start + chunk >= len(ids)
            self._run(self._recording(len(part), select if last else "logits"), part, pos0 + start)

    def decode(self, token: int, pos: int, select: str = "argmax"):
        self._run(self._recording(1, select), [token], pos)

    def last_gpu_seconds(self) -> float:
        return self._last.timings_ns()[0][1] * 1e-9

    def read_logits(self) -> np.ndarray:
        return self.logits.view(np.float32)

    def read_argmax(self) -> int:
        return int(self.best.view(np.uint32)[0])

    def read_topk(self) -> tuple[np.ndarray, np.ndarray]:
        k = min(MAX_K, self.model.config.vocab_size)
        return self.top_ids.view(np.uint32)[:k].copy(), self.top_values.view(np.float32)[:k].copy()

    def all_logits(self, ids, pos0: int = 0) -> np.ndarray:
        """Logits for every position of one chunk (tests compare them with a reference)."""
        n, vocab = len(ids), self.model.config.vocab_size
        out = self.ctx.alloc_host(4 * n * vocab)
        rec = self._record(n, "logits", logits=out)
        self._run(rec, ids, pos0)
        result = out.view(np.float32)[:n * vocab].reshape(n, vocab).copy()
        rec.destroy()
        self.ctx.free(out)
        return result

    def profile(self, n: int, pos0: int = 0) -> dict[str, tuple[int, float]]:
        """GPU time of one forward pass over n tokens by kernel: name -> (dispatches, ns)."""
        rec = self._record(n, "argmax", profile=True)
        self._run(rec, [0] * n, pos0)
        table: dict[str, tuple[int, float]] = {}
        for label, ns in rec.timings_ns():
            count, total = table.get(label, (0, 0.0))
            table[label] = (count + 1, total + ns)
        rec.destroy()
        return table

    def close(self):
        for rec in self._recordings.values():
            rec.destroy()
        self._recordings.clear()
        for buffer in (self.logits, self.best, self.top_ids, self.top_values):
            self.ctx.free(buffer)
