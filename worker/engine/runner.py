"""Runs a model's recorded forward passes: prefill in chunks, decode by replaying one command
buffer per token, and batched passes over tokens of several sequences (worker/engine/batch.py
fills their inputs). The runner owns the Workspace the passes write (worker/engine/workspace.py)
and one sequence of the paged KV cache, its own, that prefill, decode and greedy run on.
Per token the host writes the step values and token id into it, submits, waits, and reads back
what the sampler needs: the GPU argmax (4 bytes), the GPU top-k candidates, or, when penalties
must see every logit, the logits themselves. Greedy decode does not wait between tokens: the GPU
takes each step's input token from the previous step's argmax, so the next step is queued while
the host handles the current one (`greedy`)."""
from collections import OrderedDict, deque
from typing import Iterator

import numpy as np

from worker.engine.choice import HOST, MASKED
from worker.engine.errors import KVCacheFull
from worker.engine.kernels.mask import mask_logits, mask_words
from worker.engine.kernels.select import argmax, topk
from worker.engine.kernels.shapes import MAX_K
from worker.engine.workspace import Workspace

_MAX_RECORDINGS = 32  # recordings kept per model, by (tokens per pass, selection, logits rows)


class Runner:
    def __init__(self, model, max_batch: int, sequences: int = 1):
        """`max_batch`: the most tokens one pass takes (the prefill chunk); `sequences`: the most
        logits rows of a batched pass."""
        self.model, self.ctx, self.kv = model, model.ctx, model.kv
        self.workspace = Workspace.allocate(self.ctx, model.config, max_batch, model.attention_shape, sequences)
        self._greedy_fences = (self.ctx.new_fence(), self.ctx.new_fence())
        self._recordings: OrderedDict[tuple, object] = OrderedDict()
        self._last = None
        self.slot, self.own = self.kv.take_slot(), self.kv.sequence()

    # -- the runner's own sequence --------------------------------------------------------------
    def restart(self, ids: list[int]) -> int:
        """Its own sequence starts over for the prompt `ids`: the blocks it held are released
        (the full ones it committed stay cached) and the longest cached prefix of `ids` is held
        instead; returns the positions that prefix covers (K/V already in the cache)."""
        self.own.release()
        return self.own.reuse_prefix(ids)

    def commit(self, tokens: list[int], n_written: int):
        """tokens[:n_written] have their K/V in its own sequence's blocks: the full ones become reusable."""
        self.own.commit(tokens, n_written)

    def hold(self, n_positions: int):
        """Its own sequence holds blocks for positions 0..n_positions-1, its table row written."""
        if not self.own.reserve(n_positions):
            raise KVCacheFull(f"the KV cache has no room for {n_positions} positions of one more sequence")
        self.kv.write_table(self.slot, self.own)

    # -- recordings -------------------------------------------------------------------------------
    def _record(self, n: int, select: str, logits=None, profile: bool = False, rows: int | None = None):
        """`rows`: a batched pass's logits rows (ws.rows names them), None for the last token's.
        A batched pass keeps its rows in device memory (ws.batch_logits) and copies them to the
        host-visible ws.logits only with the HOST suffix (a sequence reads whole rows)."""
        rec = self.ctx.recording(max_timestamps=2, profile=profile)
        if not profile:
            rec.timestamp("start")
        ws = self.workspace
        row_logits = ws.logits if rows is None else ws.batch_logits
        self.model.record_forward(rec, ws, n, logits or row_logits, all_logits=logits is not None, rows=rows)
        vocab = self.model.config.vocab_size
        n_rows = 1 if rows is None else rows
        # "<selection>[_masked][_host]": the grammar's mask in ws.mask first, so the selection
        # (or the host, reading the row) sees only allowed tokens
        host = select.endswith(HOST)
        select = select.removesuffix(HOST)
        select, masked = select.removesuffix(MASKED), select.endswith(MASKED)
        if n_rows == 0:   # a batched pass of prefill chunks only
            select, masked, host = "logits", False, False
        if masked:
            rec.barrier()
            mask_logits(rec, row_logits, ws.mask, vocab, n_rows)
        if select != "logits":
            rec.barrier()
        if select == "argmax":
            argmax(rec, row_logits, ws.best, n_rows, vocab, ws.select)
        elif select == "topk":
            topk(rec, row_logits, ws.top_ids, ws.top_values, vocab, min(MAX_K, vocab), ws.select, n_rows)
        if host and rows is not None:
            rec.barrier()
            rec.copy(ws.batch_logits, ws.logits, 4 * vocab * n_rows)
        if not profile:
            rec.timestamp("forward")
        return rec.finish()

    def _greedy_slot(self, slot: int):
        """Buffers of the two greedy recordings: slot s reads its token from the other slot's
        argmax and its position from its own step values. Slot 0's argmax is ws.best, where the
        prefill's argmax lands, so slot 1 takes the first decode step."""
        ws = self.workspace
        steps, bests = (ws.step, ws.step_alt), (ws.best, ws.best_alt)
        return steps[slot], bests[1 - slot], bests[slot]

    def _record_greedy(self, slot: int):
        step, ids, best = self._greedy_slot(slot)
        rec = self.ctx.recording(max_timestamps=2)
        rec.timestamp("start")
        rec.barrier()   # the token comes from the argmax of the step submitted before this one
        self.model.record_forward(rec, self.workspace, 1, self.workspace.logits, ids=ids, step=step)
        rec.barrier()
        argmax(rec, self.workspace.logits, best, 1, self.model.config.vocab_size, self.workspace.select)
        rec.timestamp("forward")
        return rec.finish()

    def _recording(self, n: int, select: str, record=None, rows: int | None = None):
        key = (n, select, rows)
        if key not in self._recordings:
            if len(self._recordings) >= _MAX_RECORDINGS:
                self._recordings.popitem(last=False)[1].destroy()
            self._recordings[key] = record() if record else self._record(n, select, rows=rows)
        self._recordings.move_to_end(key)
        return self._recordings[key]

    def _run(self, rec, ids, pos0: int):
        """Runs ids at positions pos0.. of its own sequence."""
        n = len(ids)
        self.hold(pos0 + n)
        self.workspace.ids.view(np.uint32)[:n] = ids
        step = self.workspace.step.view(np.uint32)[:2 * n].reshape(n, 2)
        step[:, 0], step[:, 1] = self.slot, np.arange(pos0, pos0 + n)
        self.ctx.run(rec)
        self._last = rec

    def run_batch(self, n: int, rows: int, select: str):
        """A batched pass over the n tokens whose ids, (slot, position) pairs and logits rows
        the caller wrote into the workspace (ids, step, rows) and whose sequences' block table
        rows it wrote; `select` applies to each of the `rows` logits rows."""
        rec = self._recording(n, select, rows=rows)
        self.ctx.run(rec)
        self._last = rec

    def prefill(self, ids, pos0: int, chunk: int, select: str = "argmax"):
        """Runs ids (at positions pos0.. of its own sequence) through the model; the last one's
        logits are selected."""
        for start in range(0, len(ids), chunk):
            part = ids[start:start + chunk]
            last = start + chunk >= len(ids)
            self._run(self._recording(len(part), select if last else "logits"), part, pos0 + start)

    def decode(self, token: int, pos: int, select: str = "argmax"):
        self._run(self._recording(1, select), [token], pos)

    def greedy(self, pos: int, steps: int) -> Iterator[int]:
        """Greedy decode after a prefill that selected "argmax": step k runs the previous token
        at position pos + k and yields its argmax, at most `steps` steps. While the caller handles
        one token the next step runs, queued before it was needed: a caller that stops early
        leaves one step done for nothing, whose KV row lies past what it keeps."""
        recordings = [self._recording(1, f"greedy{slot}", lambda slot=slot: self._record_greedy(slot))
                      for slot in (0, 1)]
        in_flight: deque[int] = deque()
        self.hold(pos + steps)   # every step in flight finds its block in the table

        def launch(k: int):
            slot = (k + 1) % 2
            self._greedy_slot(slot)[0].view(np.uint32)[:2] = (self.slot, pos + k)
            self.ctx.submit(recordings[slot], self._greedy_fences[slot])
            in_flight.append(slot)

        try:
            for k in range(min(2, steps)):
                launch(k)
            for k in range(steps):
                slot = in_flight.popleft()
                self.ctx.wait(self._greedy_fences[slot])
                self._last = recordings[slot]
                token = int(self._greedy_slot(slot)[2].view(np.uint32)[0])
                yield token
                if k + 2 < steps:
                    launch(k + 2)
        finally:
            for slot in in_flight:
                self.ctx.wait(self._greedy_fences[slot])

    def mask_words(self, row: int = 0) -> np.ndarray:
        """The token mask the next "_masked" pass applies to logits row `row`, uint32
        [vocab / 32], in host-visible memory: write it before the pass (a set bit allows its token)."""
        words = mask_words(self.model.config.vocab_size)
        return self.workspace.mask.view(np.uint32)[row * words:(row + 1) * words]

    def last_gpu_seconds(self) -> float:
        return self._last.timings_ns()[0][1] * 1e-9

    def read_logits(self, row: int = 0) -> np.ndarray:
        vocab = self.model.config.vocab_size
        return self.workspace.logits.view(np.float32)[row * vocab:(row + 1) * vocab]

    def read_argmax(self, row: int = 0) -> int:
        return int(self.workspace.best.view(np.uint32)[row])

    def read_topk(self, row: int = 0) -> tuple[np.ndarray, np.ndarray]:
        k = min(MAX_K, self.model.config.vocab_size)
        ws = self.workspace
        return (ws.top_ids.view(np.uint32)[row * k:(row + 1) * k].copy(),
                ws.top_values.view(np.float32)[row * k:(row + 1) * k].copy())

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
        self.own.release()
        self.kv.give_slot(self.slot)
        self.workspace.free(self.ctx)
