"""Runs a model's recorded forward passes: prefill in chunks, decode by replaying one command
buffer per token, and batched passes over tokens of several sequences (worker/engine/batch.py
fills their inputs). The runner owns the Workspace the passes write (worker/engine/workspace.py)
and one sequence of the paged KV cache, its own, that prefill, decode and greedy run on.
Per token the host writes the step values and token id into it, submits, waits, and reads back
what the sampler needs: the GPU argmax (4 bytes), the GPU top-k candidates, or, when penalties
must see every logit, the logits themselves. Greedy decode does not wait between tokens: the GPU
takes each step's input token from the previous step's argmax, so the next step is queued while
the host handles the current one (`greedy`).

A model split across contexts (worker/engine/placement.py) has a workspace and a command buffer
per stage (worker/engine/staged.py): the host writes a pass's inputs into the first stage's
workspace (`workspace`) and reads its outputs from the last one's; in split greedy decode each
step's argmax reaches the first stage of the next through the memory they share, and where the
host orders the stages, the next step is queued once the step before has ended."""
from collections import OrderedDict, deque
from typing import Iterator

import numpy as np

from worker.engine.choice import HOST, MASKED
from worker.engine.errors import KVCacheFull
from worker.engine.intmath import round_up
from worker.engine.kernels.attention import write_tiles
from worker.engine.kernels.mask import mask_logits, mask_words
from worker.engine.kernels.select import argmax, topk
from worker.engine.kernels.shapes import MAX_K
from worker.engine.staged import StagedPass, handoff_poll_s
from worker.engine.vk.linked import SharedMemory, Timeline, shares_timeline
from worker.engine.workspace import Workspace

_MAX_RECORDINGS = 64  # recordings kept per model, by (tokens per pass, selection, logits rows)
# The workspace buffers of the fed batch passes of each parity (Runner.queue_fed_batch): the token
# ids (the other parity's argmax), the step values, the argmax.
_FED_BUFFERS = (("best", "step", "best_alt"), ("best_alt", "step_alt", "best"))


def recorded_size(count: int, capacity: int) -> int:
    """The size (tokens, or logits rows) a pass of `count` is recorded for, at most `capacity`:
    a power of two up to 8, then a multiple of 8. The entries past `count` repeat its last one
    (`_pad`). Recording a pass costs the host tens of microseconds a dispatch (the `vulkan`
    package builds every struct in Python; 0.42 ms a dispatch under cProfile on the GPU
    machine), tens of milliseconds or more for a 32-layer model's 342 dispatches: a batch whose
    sequences come and go, or prompts of every length, would otherwise record a pass for nearly
    every step (32 sequences of the 8B, ending one by one: 292 tok/s before, 944 after)."""
    if count <= 1:
        return count
    return min(capacity, 1 << (count - 1).bit_length() if count <= 8 else round_up(count, 8))


class Runner:
    def __init__(self, model, max_batch: int, sequences: int = 1):
        """`max_batch`: the most tokens one pass takes (the prefill chunk); `sequences`: the most
        logits rows of a batched pass."""
        self.model, self.kv, self.stages = model, model.kv, model.stages
        ctxs = [stage.ctx for stage in self.stages]
        self._shared = self._timeline = None
        shared = [{}] * len(ctxs)
        if len(ctxs) > 1:
            sizes = Workspace.sizes(model.config, max_batch, sequences, staged=True)
            self._shared = SharedMemory(ctxs, {name: sizes[name] for name in Workspace.SHARED})
            shared = [dict(zip(Workspace.SHARED, buffers))
                      for buffers in zip(*(self._shared.buffers(name) for name in Workspace.SHARED))]
            self._timeline = Timeline(ctxs) if shares_timeline(ctxs) else None
        self.workspaces = [Workspace.allocate(stage.ctx, model.config, max_batch, model.attention_shape, sequences,
                                              stage_shared) for stage, stage_shared in zip(self.stages, shared)]
        # the host writes a pass's inputs into the first stage's and reads its outputs from the last one's
        self.workspace, self._out = self.workspaces[0], self.workspaces[-1]
        self._fences = self._new_fences()
        self._greedy_fences = (self._new_fences(), self._new_fences())
        self._fed_fences = (self._new_fences(), self._new_fences())
        self._recordings: OrderedDict[tuple, object] = OrderedDict()
        self._last = None   # the pass that ran last
        self._fed: list = [None, None]   # the fed batch pass of each parity queued last
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

    def _new_fences(self) -> list:
        return [stage.ctx.new_fence() for stage in self.stages]

    # -- recordings -------------------------------------------------------------------------------
    def _staged(self, n: int, record_stage, inputs: dict[str, int], profile: bool = False) -> StagedPass:
        """A pass over n tokens: record_stage(rec, stage, ws) records each stage's part."""
        recordings = []
        for stage, ws in zip(self.stages, self.workspaces):
            rec = stage.ctx.recording(max_timestamps=2, profile=profile)
            if not profile:
                rec.timestamp("start")
            record_stage(rec, stage, ws)
            if not profile:
                rec.timestamp("forward")
            recordings.append(rec.finish())
        return StagedPass(recordings, self.workspaces, inputs, self._timeline)

    def _record(self, n: int, select: str, logits=None, profile: bool = False, rows: int | None = None,
                ids: str = "ids", step: str = "step", best: str = "best", distinct: bool = False) -> StagedPass:
        """`rows`: a batched pass's logits rows (ws.rows names them), None for the last token's.
        A batched pass keeps its rows in device memory (ws.batch_logits) and copies them to the
        host-visible ws.logits only with the HOST suffix (a sequence reads whole rows). `ids`,
        `step`, `best`: the workspace buffers holding the token ids and the step values, and the
        one the argmax selection writes. `distinct`: each token is the only one of its sequence
        (a batched decode pass: attention appends the K/V itself, attention.takes_rope)."""
        inputs = {step: 8 * n, **({"rows": 4 * rows} if rows else {})}
        if self.workspace.attention_tiles is not None:
            inputs["attention_tiles"] = self.workspace.attention_tiles.size
        return self._staged(n, lambda rec, stage, ws: self._record_stage(rec, stage, ws, n, select, logits, rows,
                                                                         ids, step, best, distinct), inputs, profile)

    def _record_stage(self, rec, stage, ws, n: int, select: str, logits, rows: int | None, ids: str, step: str,
                      best: str, distinct: bool):
        row_logits = ws.logits if rows is None else ws.batch_logits
        self.model.record_forward(rec, ws, stage, n, logits or row_logits, all_logits=logits is not None, rows=rows,
                                  ids=ids, step=step, distinct=distinct)
        if not stage.last:
            return
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
            argmax(rec, row_logits, getattr(ws, best), n_rows, vocab, ws.select)
        elif select == "topk":
            topk(rec, row_logits, ws.top_ids, ws.top_values, vocab, min(MAX_K, vocab), ws.select, n_rows)
        if host and rows is not None:
            rec.barrier()
            rec.copy(ws.batch_logits, ws.logits, 4 * vocab * n_rows)

    def _greedy_slot(self, slot: int):
        """Buffers of the two greedy recordings: slot s reads its token from the other slot's
        argmax and its position from its own step values. Slot 0's argmax is ws.best, where the
        prefill's argmax lands, so slot 1 takes the first decode step."""
        steps, bests = ("step", "step_alt"), ("best", "best_alt")
        return steps[slot], bests[1 - slot], bests[slot]

    def _record_greedy(self, slot: int) -> StagedPass:
        step, ids, best = self._greedy_slot(slot)

        def record_stage(rec, stage, ws):
            rec.barrier()   # the token comes from the argmax of the step submitted before this one
            self.model.record_forward(rec, ws, stage, 1, ws.logits, ids=ids, step=step)
            if stage.last:
                rec.barrier()
                argmax(rec, ws.logits, getattr(ws, best), 1, self.model.config.vocab_size, ws.select)
        return self._staged(1, record_stage, {step: 8})

    def _recording(self, n: int, select: str, record=None, rows: int | None = None, distinct: bool = False):
        key = (n, select, rows, distinct)
        if key not in self._recordings:
            if len(self._recordings) >= _MAX_RECORDINGS:
                self._recordings.popitem(last=False)[1].destroy()
            self._recordings[key] = record() if record else self._record(n, select, rows=rows, distinct=distinct)
        self._recordings.move_to_end(key)
        return self._recordings[key]

    def _pad(self, n: int, size: int, rows: int = 0, row_size: int = 0, distinct: bool = False):
        """Tokens n..size-1 of a pass recorded for `size` repeat token n - 1 (its id, sequence
        slot and position: the same K/V written twice, the same logits), and logits rows
        rows..row_size-1 repeat row rows - 1; what the pads compute is never read. `distinct`:
        as _record's."""
        ws = self.workspace
        token_ids = ws.ids.view(np.uint32)
        token_ids[n:size] = token_ids[n - 1]
        step = ws.step.view(np.uint32)[:2 * size].reshape(size, 2)
        step[n:] = step[n - 1]
        if row_size > rows:
            out_rows = ws.rows.view(np.uint32)
            out_rows[rows:row_size] = out_rows[rows - 1]
        self._write_tiles(size, distinct=distinct)

    def _write_tiles(self, size: int, step: str = "step", distinct: bool = False):
        """The attention tiles of a pass of `size` tokens (`distinct`: as _record's) whose step
        values (in the workspace's buffer `step`) are written, where it takes the tiled kernel."""
        tiles = self.workspace.attention_tiles
        if tiles is not None and self.model.tiled_attention(size, distinct):
            write_tiles(getattr(self.workspace, step).view(np.uint32)[:2 * size].reshape(size, 2),
                        tiles.view(np.uint32).reshape(-1, 2))

    def _size(self, n: int) -> int:
        return recorded_size(n, self.workspace.n)

    def _row_size(self, rows: int) -> int:
        return recorded_size(rows, self.workspace.sequences)

    def recorded_passes(self) -> list[tuple[int, str, int | None, bool]]:
        """(tokens, selection, logits rows, distinct) of the passes recorded and kept, oldest first."""
        return list(self._recordings)

    def _run(self, rec, ids, pos0: int, size: int | None = None):
        """Runs ids at positions pos0.. of its own sequence, through a pass recorded for `size`
        tokens (default: len(ids))."""
        n = len(ids)
        self.hold(pos0 + n)
        self.workspace.ids.view(np.uint32)[:n] = ids
        step = self.workspace.step.view(np.uint32)[:2 * n].reshape(n, 2)
        step[:, 0], step[:, 1] = self.slot, np.arange(pos0, pos0 + n)
        self._pad(n, size or n)
        rec.run(self._fences)
        self._last = rec

    def run_batch(self, n: int, rows: int, select: str, distinct: bool = False):
        """A batched pass over the n tokens whose ids, (slot, position) pairs and logits rows
        the caller wrote into the workspace (ids, step, rows) and whose sequences' block table
        rows it wrote; `select` applies to each of the `rows` logits rows. `distinct`: each token
        is the only one of its sequence (a pass of decode tokens)."""
        size, row_size = self._size(n), self._row_size(rows)
        self._pad(n, size, rows, row_size, distinct)
        rec = self._recording(size, select, rows=row_size, distinct=distinct)
        rec.run(self._fences)
        self._last = rec

    def fed_depth(self, n: int) -> int:
        """How many fed batch passes over n sequences may be in flight at once: two, each with
        step values and an argmax of its own (`queue_fed_batch`), as greedy decode keeps; one
        where the host orders the stages (the next pass's first stage would not wait for the
        last stage of the one before) or where the pass takes tiled attention (its tiles are
        host-written into one buffer; not where attention appends the pass's K/V itself)."""
        tiled = self.workspace.attention_tiles is not None and self.model.tiled_attention(self._row_size(n), True)
        return 1 if tiled or (self._shared is not None and self._timeline is None) else 2

    def queue_fed_batch(self, slots: list[int], positions: list[int], parity: int, ids: list[int] | None = None):
        """Queues, without waiting (`finish_fed` ends it), a batched greedy pass over one token of
        each sequence in `slots` at `positions`, each token its own logits row. The tokens are
        the argmax rows of the fed pass of the other parity queued just before it, read on the
        GPU (so it can run while the host handles them), or `ids` where given (nothing fed in
        flight: the host knows them). The caller wrote the sequences' block table rows. Each
        parity has its own step values and argmax (_FED_BUFFERS), so one pass of each may be in
        flight."""
        ids_name, step_name, best_name = _FED_BUFFERS[parity]
        n, size = len(slots), self._row_size(len(slots))
        ws = self.workspace
        # the pads (entries n..size-1) repeat the last sequence; its row's argmax feeds their ids
        pairs = getattr(ws, step_name).view(np.uint32)[:2 * size].reshape(size, 2)
        pairs[:n, 0], pairs[:n, 1] = slots, positions
        pairs[n:] = pairs[n - 1]
        self._write_tiles(size, step_name, distinct=True)
        if ids is not None:
            getattr(ws, ids_name).view(np.uint32)[:size] = ids + ids[-1:] * (size - n)
            ws.rows.view(np.uint32)[:size] = np.minimum(np.arange(size), n - 1)
        rec = self._recording(size, f"argmax_fed{parity}", rows=size, distinct=True,
                              record=lambda: self._record(size, "argmax", rows=size, ids=ids_name, step=step_name,
                                                          best=best_name, distinct=True))
        rec.submit(self._fed_fences[parity])
        self._last = self._fed[parity] = rec

    def finish_fed(self, parity: int, n: int) -> list[int]:
        """Waits for the fed pass of `parity` queued last; the argmax of its first n rows."""
        self._fed[parity].wait(self._fed_fences[parity])
        return getattr(self._out, _FED_BUFFERS[parity][2]).view(np.uint32)[:n].tolist()

    def prefill(self, ids, pos0: int, chunk: int, select: str = "argmax"):
        """Runs ids (at positions pos0.. of its own sequence) through the model; the last one's
        logits are selected."""
        for start in range(0, len(ids), chunk):
            part = ids[start:start + chunk]
            last = start + chunk >= len(ids)
            size = self._size(len(part))
            self._run(self._recording(size, select if last else "logits"), part, pos0 + start, size)

    def decode(self, token: int, pos: int, select: str = "argmax"):
        self._run(self._recording(1, select), [token], pos)

    def greedy(self, pos: int, steps: int) -> Iterator[int]:
        """Greedy decode after a prefill that selected "argmax": step k runs the previous token
        at position pos + k and yields its argmax, at most `steps` steps. While the caller handles
        one token the next step runs, queued before it was needed: a caller that stops early
        leaves one step done for nothing, whose KV row lies past what it keeps. Split across
        contexts with no timeline shared between them, the host orders the stages: the step after
        is queued once this one has ended, and then runs while the caller handles its token."""
        recordings = [self._recording(1, f"greedy{slot}", lambda slot=slot: self._record_greedy(slot))
                      for slot in (0, 1)]
        in_flight: deque[int] = deque()
        unfinished: set[int] = set()   # slots in flight not yet waited on
        self.hold(pos + steps)   # every step in flight finds its block in the table

        def finish(slot: int, poll_s: float = 0.0):
            if slot in unfinished:
                recordings[slot].wait(self._greedy_fences[slot], poll_s)
                unfinished.discard(slot)

        def launch(k: int):
            slot = (k + 1) % 2
            step = self._greedy_slot(slot)[0]
            getattr(self.workspace, step).view(np.uint32)[:2] = (self.slot, pos + k)
            if self._shared is not None and self._timeline is None:   # the token of step k - 1 comes first
                finish(1 - slot, handoff_poll_s(self.stages[-1].ctx))
            recordings[slot].submit(self._greedy_fences[slot])
            in_flight.append(slot)
            unfinished.add(slot)

        try:
            for k in range(min(2, steps)):
                launch(k)
            for k in range(steps):
                slot = in_flight.popleft()
                finish(slot)
                self._last = recordings[slot]
                token = int(getattr(self._out, self._greedy_slot(slot)[2]).view(np.uint32)[0])
                yield token
                if k + 2 < steps:
                    launch(k + 2)
        finally:
            for slot in in_flight:
                finish(slot)

    def mask_words(self, row: int = 0) -> np.ndarray:
        """The token mask the next "_masked" pass applies to logits row `row`, uint32
        [vocab / 32], in host-visible memory: write it before the pass (a set bit allows its token)."""
        words = mask_words(self.model.config.vocab_size)
        return self._out.mask.view(np.uint32)[row * words:(row + 1) * words]

    def last_gpu_seconds(self) -> float:
        return self._last.gpu_seconds()

    def read_logits(self, row: int = 0) -> np.ndarray:
        vocab = self.model.config.vocab_size
        return self._out.logits.view(np.float32)[row * vocab:(row + 1) * vocab]

    def read_argmax(self, row: int = 0) -> int:
        return int(self._out.best.view(np.uint32)[row])

    def read_best(self, n: int) -> list[int]:
        """The GPU argmax of the first n logits rows of the last pass."""
        return self._out.best.view(np.uint32)[:n].tolist()

    def read_topk(self, row: int = 0) -> tuple[np.ndarray, np.ndarray]:
        k = min(MAX_K, self.model.config.vocab_size)
        ws = self._out
        return (ws.top_ids.view(np.uint32)[row * k:(row + 1) * k].copy(),
                ws.top_values.view(np.float32)[row * k:(row + 1) * k].copy())

    def all_logits(self, ids, pos0: int = 0) -> np.ndarray:
        """Logits for every position of `ids` (tests compare them with a reference), in chunks
        of the largest pass."""
        chunk, vocab = self.workspace.n, self.model.config.vocab_size
        ctx = self.stages[-1].ctx
        out = ctx.alloc_host(4 * min(len(ids), chunk) * vocab)
        rows = []
        try:
            for start in range(0, len(ids), chunk):
                part = ids[start:start + chunk]
                rec = self._record(len(part), "logits", logits=out)
                self._run(rec, part, pos0 + start)
                rows.append(out.view(np.float32)[:len(part) * vocab].reshape(len(part), vocab).copy())
                rec.destroy()
        finally:
            ctx.free(out)
        return np.concatenate(rows)

    def profile(self, n: int, pos0: int = 0) -> dict[str, tuple[int, float]]:
        """GPU time of one forward pass over n tokens of its own sequence (a prefill chunk) by
        kernel: name -> (dispatches, ns)."""
        rec = self._record(n, "argmax", profile=True)
        self._run(rec, [0] * n, pos0)
        return self._timings(rec)

    def profile_decode(self, n: int, pos: int) -> dict[str, tuple[int, float]]:
        """As `profile`, for one batched decode step of n sequences at position pos each (the
        shape of Batch's decode passes: one token and one logits row a sequence, attention over
        each sequence's own blocks). The sequences are taken and given back here; their K/V
        rows before pos are whatever the blocks held."""
        slots = [self.kv.take_slot() for _ in range(n)]
        seqs = [self.kv.sequence() for _ in range(n)]
        try:
            if None in slots or not all(seq.reserve(pos + 1) for seq in seqs):
                raise KVCacheFull(f"the KV cache has no room for {n} sequences of {pos + 1} positions")
            for slot, seq in zip(slots, seqs):
                self.kv.write_table(slot, seq)
            ws = self.workspace
            ws.ids.view(np.uint32)[:n] = 0
            step = ws.step.view(np.uint32)[:2 * n].reshape(n, 2)
            step[:, 0], step[:, 1] = slots, pos
            ws.rows.view(np.uint32)[:n] = np.arange(n)
            self._write_tiles(n, distinct=True)
            rec = self._record(n, "argmax", profile=True, rows=n, distinct=True)
            rec.run(self._fences)
            return self._timings(rec)
        finally:
            for seq in seqs:
                seq.release()
            for slot in slots:
                if slot is not None:
                    self.kv.give_slot(slot)

    @staticmethod
    def _timings(rec) -> dict[str, tuple[int, float]]:
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
        for stage, ws in zip(self.stages, self.workspaces):
            ws.free(stage.ctx)
        for shared in (self._timeline, self._shared):
            if shared is not None:
                shared.destroy()
