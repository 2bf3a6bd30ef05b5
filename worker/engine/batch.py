"""Continuous batching over one Engine's model: sequences join and leave between steps.

Each step is one forward pass over N tokens, each carrying its sequence's slot and its position
in the step buffer (vLLM v1's scheduling): the next token of every running sequence, then prefill
chunks of joining ones, within the prefill chunk's token budget, so running sequences keep
streaming while a long prompt is prefilled. Logits are computed only for the rows that need
them (each sequence's last token when the pass reaches the end of what it knows), gathered
before the output head, in device memory (copied to the host only when a sequence's sampler or
logprobs read whole rows); per-row argmax or top-k run on the GPU, and each sequence picks its
token on the host with its own sampler, seed, penalties, stop strings, max_tokens, logprobs and
grammar mask. A pass is recorded once per (tokens, logits rows, selection) and replayed.

KV memory is paged (kvcache.py): a sequence takes blocks as it grows. A joining sequence first
holds the cached blocks of its prompt's longest cached prefix (kvblocks.py) and prefills only
the rest. When a running sequence needs a block and none is left, the most recently admitted
sequence not yet in this pass is preempted: its full blocks stay cached, it waits at the head of
the queue and, readmitted, recomputes from what is still cached (vLLM's recompute preemption);
its token stream and sampler state carry on unchanged. Sequences are served oldest first, so
when all others are already in the pass, the one short of a block sits this step out.

While every running sequence decodes greedily (no grammar, no logprobs, nobody joining), each
step queues the passes after its own before handling its tokens, the GPU feeding every sequence
its own argmax (as Runner.greedy does for one): two passes in flight, so the GPU runs the next
while the host handles one step's tokens and queues the one after (Runner.fed_depth: one where
the host orders a split model's stages).

A Batch shares its Engine's Runner (workspace and recordings) with Engine.generate, which settles
the batch's pass in flight first: a generation may run between two steps, not inside one.
"""
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from worker.engine.choice import HOST, MASKED, next_token, token_logprobs
from worker.engine.errors import KVCacheFull, MinTokensUnmet
from worker.engine.generation import Event
from worker.engine.grammar import GrammarError
from worker.engine.kvblocks import BLOCK_TOKENS
from worker.engine.sequence import Request, Sequence

ALL_ALLOWED = 0xFFFFFFFF   # a mask word allowing every token (rows without a grammar)


@dataclass(eq=False)
class FedPass:
    """A pass queued by a step for the steps after it (Batch._queue_fed): (sequence, position, 1)
    per token, the parity of its buffers (Runner.queue_fed_batch), and its argmax rows once waited
    for (None while it may be in flight)."""
    plan: list
    parity: int
    best: list[int] | None = None


class Batch:
    """Continuous batching over one Engine's model: sequences join and leave between steps."""

    def __init__(self, engine, max_sequences: int):
        self.engine, self.max_sequences = engine, max_sequences
        self.runner, self.kv = engine.runner, engine.kv
        self._running: list[Sequence] = []   # admitted (holding a slot), in admission order
        self._waiting: deque[Sequence] = deque()
        self.preemptions = 0   # sequences sent back to wait for blocks (cumulative)
        self._fed: deque[FedPass] = deque()   # passes queued by earlier steps (_queue_fed), oldest first
        self.fed_passes = 0    # passes queued that way (cumulative)

    def add(self, request: Request, tag=None) -> Sequence:
        """Validates at once (PromptTooLong, VkllmError, GrammarError raised here, nothing joins);
        otherwise the sequence joins, prefilled in chunks over the next steps."""
        self.engine.check_prompt(request.ids)
        matcher = self.engine.constraint(request.constraint) if request.constraint is not None else None
        seq = Sequence(request, tag, self.engine, matcher)
        self._waiting.append(seq)
        return seq

    def room(self) -> bool:
        """Whether another sequence may join now: nobody waits, a slot is free, and a block is
        left beyond one for each running sequence's next position."""
        return (not self._waiting and len(self._running) < self.max_sequences
                and self.kv.pool.available > len(self._running))

    def cancel(self, seq: Sequence):
        """It ends at the next step with finish_reason "cancelled"."""
        self.end(seq, "cancelled")

    def end(self, seq: Sequence, reason: str):
        """It ends at the next step, before any further token of it is picked, with this finish
        reason (the service ends a job whose one tool call is complete with "stop")."""
        seq.ending = reason

    def __len__(self) -> int:
        return len(self._running) + len(self._waiting)

    def stats(self) -> dict:
        return {**self.kv.stats(), "sequences": len(self), "preemptions": self.preemptions,
                "fed_passes": self.fed_passes}

    # -- one step ---------------------------------------------------------------------------------
    def step(self) -> list[tuple[Sequence, Event]]:
        """One forward pass over every running sequence's next token plus prefill chunks of
        joining ones; the events produced, in order. A sequence's last event has finish_reason
        set ("stop", "length", "cancelled"); it has then left the batch. Raises KVCacheFull only
        when blocks held outside the batch leave even its oldest sequence no room."""
        events = []
        for seq in [s for s in (*self._running, *self._waiting) if s.ending]:
            events.append((seq, self._finish(seq, seq.ending)))
        best = None   # the pass's argmax rows, once it is done
        if self._fed:   # queued by an earlier step while its tokens were handled
            fed = self._fed.popleft()
            self._wait(fed)
            plan, select, best = fed.plan, "argmax", fed.best
        else:
            plan = self._schedule()
            if not plan:
                return events
            select = self._write_pass(plan)
            self.runner.run_batch(sum(count for _, _, count in plan),
                                  sum(start + count == len(seq.tokens) for seq, start, count in plan), select,
                                  distinct=all(count == 1 for _, _, count in plan))
        now = time.perf_counter()
        # a fed pass keeps the rows of sequences that ended since it was queued: skipped here
        out_rows = [seq for seq, start, count in plan if seq.done or start + count == len(seq.tokens)]
        if best is None and select == "argmax":
            best = self.runner.read_best(len(out_rows))
        plan = [entry for entry in plan if not entry[0].done]
        for seq, start, count in plan:
            seq.written = start + count
            seq.blocks.commit(seq.tokens, seq.written)
        rows = [(row, seq) for row, seq in enumerate(out_rows) if not seq.done]
        self._queue_fed(plan, rows, select, best)
        for row, seq in rows:
            events.extend((seq, event) for event in self._advance(seq, row, select, now, best))
        return events

    def settle(self):
        """Waits for the passes still in flight and takes their tokens: then their sequences'
        blocks may go and the workspace is free for other passes (Engine.generate settles first)."""
        for fed in self._fed:
            self._wait(fed)

    def _wait(self, fed: FedPass):
        if fed.best is None:
            fed.best = self.runner.finish_fed(fed.parity, len(fed.plan))

    def _queue_fed(self, plan, rows, select: str, best: list[int] | None):
        """After a greedy decode pass, queues the passes after it (up to Runner.fed_depth in
        flight) before the host has looked at its tokens: the GPU feeds each sequence its argmax
        (Runner.queue_fed_batch), so the host's handling of this step overlaps them. Only while
        nothing else could change them: every running sequence in this pass, greedy,
        unconstrained, decoding one token, none waiting or ending, none past its last position
        (Sequence.last_position), a block for each position at hand. A sequence that ends on a
        stop has had the positions in flight computed for nothing (in its own blocks, kept
        until those passes are done)."""
        if (select != "argmax" or self._waiting or not plan or len(rows) != len(plan)
                or len(plan) != len(self._running)   # one that sat this step out would starve
                or any(count != 1 or seq.ending for seq, _, count in plan)
                or [row for row, _ in rows] != list(range(len(rows)))):
            return
        seqs = [seq for _, seq in rows]
        while len(self._fed) < self.runner.fed_depth(len(seqs)):
            last = self._fed[-1] if self._fed else None
            if last is not None and [seq for seq, _, _ in last.plan] != seqs:
                return   # it computes for a sequence that has ended since
            positions = [pos + 1 for _, pos, _ in last.plan] if last else [seq.written for seq in seqs]
            if any(pos > seq.last_position for seq, pos in zip(seqs, positions)) \
                    or not all(seq.blocks.reserve(pos + 1) for seq, pos in zip(seqs, positions)):
                return
            # a pass in flight reads these rows too: they only gain blocks past its positions
            for seq in seqs:
                self.kv.write_table(seq.slot, seq.blocks)
            # the tokens: this pass's argmax, or a pass's waited for since (a generation may
            # have run in between), from the host; else the argmax of the pass in flight
            ids = best[:len(seqs)] if last is None else last.best
            parity = 0 if last is None else 1 - last.parity
            self.runner.queue_fed_batch([seq.slot for seq in seqs], positions, parity, ids)
            self._fed.append(FedPass([(seq, pos, 1) for seq, pos in zip(seqs, positions)], parity))
            self.fed_passes += 1

    def _schedule(self) -> list[tuple[Sequence, int, int]]:
        """(sequence, first position, tokens) of the next pass: decode tokens first, then prefill
        chunks of admitted sequences, then newly admitted ones, within the token budget."""
        budget, plan = self.runner.workspace.n, []
        decoding = [s for s in self._running if len(s.tokens) - s.written == 1]
        prefilling = [s for s in self._running if len(s.tokens) - s.written > 1]
        for seq in [*decoding, *prefilling]:
            if budget == 0:
                break
            if seq not in self._running:   # preempted by an earlier one of this step
                continue
            count = min(len(seq.tokens) - seq.written, budget)
            while not seq.blocks.reserve(seq.written + count):
                if not self._preempt_newest(other_than=seq, planned=plan):
                    break
            count = min(count, len(seq.blocks.blocks) * BLOCK_TOKENS - seq.written)
            if count <= 0:
                if not plan and seq is self._running[0]:
                    raise KVCacheFull("the KV cache cannot hold the oldest running sequence's next position")
                continue
            plan.append((seq, seq.written, count))
            budget -= count
        while budget > 0 and self._waiting and len(self._running) < self.max_sequences:
            seq = self._waiting[0]
            blocks = self.kv.sequence()
            hit = blocks.reuse_prefix(seq.tokens)
            count = min(len(seq.tokens) - hit, budget)
            if not blocks.reserve(hit + count):   # a shorter first chunk, in the blocks it got
                count = len(blocks.blocks) * BLOCK_TOKENS - hit
                if count <= 0:
                    blocks.release()
                    blocks.pool.hit_tokens -= hit
                    break
            self._waiting.popleft()
            seq.slot, seq.blocks, seq.written = self.kv.take_slot(), blocks, hit
            seq.admitted = seq.admitted or time.perf_counter()
            self._running.append(seq)
            plan.append((seq, hit, count))
            budget -= count
        return plan

    def _preempt_newest(self, other_than: Sequence, planned) -> bool:
        """Frees the blocks of the most recently admitted sequence not yet in this pass; False if none."""
        in_pass = {id(s) for s, _, _ in planned}
        for victim in reversed(self._running):
            if victim is not other_than and id(victim) not in in_pass:
                self._leave(victim)
                victim.written = 0
                self._waiting.appendleft(victim)
                self.preemptions += 1
                return True
        return False

    def _write_pass(self, plan) -> str:
        """Writes the pass's token ids, (slot, position) pairs, logits rows, block table rows and
        grammar masks; returns the selection every logits row gets."""
        ws = self.runner.workspace
        # gathered in lists, written with one numpy assignment each (32 sequences' small writes
        # one by one would cost more host time than the pass's submission)
        ids, slots, positions, rows, out = [], [], [], [], []
        for seq, start, count in plan:
            ids += seq.tokens[start:start + count]
            slots += [seq.slot] * count
            positions += range(start, start + count)
            self.kv.write_table(seq.slot, seq.blocks)
            if start + count == len(seq.tokens):
                rows.append(len(ids) - 1)
                out.append(seq)
        n = len(ids)
        ws.ids.view(np.uint32)[:n] = ids
        pairs = ws.step.view(np.uint32)[:2 * n].reshape(n, 2)
        pairs[:, 0], pairs[:, 1] = slots, positions
        ws.rows.view(np.uint32)[:len(rows)] = rows
        masked = any(seq.matcher is not None for seq in out)
        for row, seq in enumerate(out if masked else ()):
            words = self.runner.mask_words(row)
            if seq.matcher is None:
                words[:] = ALL_ALLOWED
            else:
                try:
                    seq.matcher.fill(words)
                except GrammarError as e:   # its row is computed for nothing: it ends with the error
                    words[:] = ALL_ALLOWED
                    seq.failed = e
        if not out:
            return "logits"   # no logits rows: nothing to select
        # whole rows to the host only for a sampler that reads them or for logprobs' normaliser
        host = any(seq.select == "logits" or seq.request.logprobs is not None for seq in out)
        return (("topk" if any(seq.select == "topk" for seq in out) else "argmax") + (MASKED if masked else "")
                + (HOST if host else ""))

    def _advance(self, seq: Sequence, row: int, select: str, now: float, best: list[int] | None):
        """The events of the token seq picks from logits row `row`: the token's, and its last if
        it ends. `best`: the pass's argmax rows, read before a fed pass overwrites them. A
        min_tokens its grammar cannot meet, or a grammar the library gives up on (its mask or the
        token taken), ends it alone, with the error."""
        if seq.failed is not None:
            return [self._finish(seq, "error", seq.failed)]
        try:
            token = best[row] if best is not None else next_token(self.runner, seq.sampler, select, seq.tokens, row)
            logprobs = None if seq.request.logprobs is None else token_logprobs(
                self.runner.read_logits(row), token, *self.runner.read_topk(row), seq.request.logprobs)
            event, reason = seq.take(token, logprobs, now)
        except (MinTokensUnmet, GrammarError) as e:   # the pick (min_tokens) or the grammar taking it
            return [self._finish(seq, "error", e)]
        events = [] if event is None else [event]
        if reason is not None:
            events.append(self._finish(seq, reason))
        return events

    def _leave(self, seq: Sequence):
        """seq gives back its slot and blocks (its full written blocks stay cached)."""
        if seq.admitted_now:
            self.settle()
            seq.blocks.commit(seq.tokens, seq.written)
            seq.blocks.release()
            self.kv.give_slot(seq.slot)
            self._running.remove(seq)
            seq.slot, seq.blocks = None, None

    def _finish(self, seq: Sequence, reason: str, error: Exception | None = None) -> Event:
        self._leave(seq)
        if seq in self._waiting:
            self._waiting.remove(seq)
        return seq.last_event(reason, error)
