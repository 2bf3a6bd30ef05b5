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

A Batch shares its Engine's Runner (workspace and recordings) with Engine.generate: use one or
the other at a time, not both interleaved.
"""
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from worker.engine.choice import HOST, MASKED, next_token, selection, token_logprobs
from worker.engine.errors import KVCacheFull
from worker.engine.generation import Event, Timings
from worker.engine.grammar import Constraint
from worker.engine.kvblocks import BLOCK_TOKENS
from worker.engine.sampling import Sampler, SamplingParams, StopMatcher
from worker.engine.tokenizer import StreamDecoder

ALL_ALLOWED = 0xFFFFFFFF   # a mask word allowing every token (rows without a grammar)


@dataclass(frozen=True)
class Request:
    """One generation, as the service hands it to the engine."""
    ids: list[int]                  # prompt tokens
    params: SamplingParams          # already filled with the model's defaults
    logprobs: int | None = None
    constraint: dict | None = None  # response_format / forced tool call (worker/engine/grammar.py)


class Sequence:
    """One generation inside a Batch. `tag` is the caller's; `done` once its last event (the one
    with finish_reason) has been returned."""

    def __init__(self, request: Request, tag, engine, matcher: Constraint | None):
        self.request, self.tag, self.matcher = request, tag, matcher
        self.done, self.cancelled = False, False
        self.tokens = list(request.ids)     # the prompt, then every generated token kept
        self.written = 0                    # tokens whose K/V are in the cache
        self.slot, self.blocks = None, None
        self.sampler = Sampler(request.params, engine.config.vocab_size)
        self.decoder, self.stops = StreamDecoder(engine.tokenizer), StopMatcher(request.params.stop)
        # what this sequence needs from the GPU; logprobs take alternatives from the top-k
        self.select = "topk" if request.logprobs is not None else selection(request.params)
        self.generated, self.matched_stop = 0, False
        self.added = time.perf_counter()
        self.admitted = self.first_token_at = None

    @property
    def admitted_now(self) -> bool:
        return self.slot is not None


class Batch:
    """Continuous batching over one Engine's model: sequences join and leave between steps."""

    def __init__(self, engine, max_sequences: int):
        self.engine, self.max_sequences = engine, max_sequences
        self.runner, self.kv = engine.runner, engine.kv
        self._running: list[Sequence] = []   # admitted (holding a slot), in admission order
        self._waiting: deque[Sequence] = deque()
        self.preemptions = 0   # sequences sent back to wait for blocks (cumulative)

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
        seq.cancelled = True

    def __len__(self) -> int:
        return len(self._running) + len(self._waiting)

    def stats(self) -> dict:
        return {**self.kv.stats(), "sequences": len(self), "preemptions": self.preemptions}

    # -- one step ---------------------------------------------------------------------------------
    def step(self) -> list[tuple[Sequence, Event]]:
        """One forward pass over every running sequence's next token plus prefill chunks of
        joining ones; the events produced, in order. A sequence's last event has finish_reason
        set ("stop", "length", "cancelled"); it has then left the batch."""
        events = []
        for seq in [s for s in (*self._running, *self._waiting) if s.cancelled]:
            events.append((seq, self._finish(seq, "cancelled")))
        plan = self._schedule()
        if not plan:
            return events
        select = self._write_pass(plan)
        out_rows = [seq for seq, start, count in plan if start + count == len(seq.tokens)]
        self.runner.run_batch(sum(count for _, _, count in plan), len(out_rows), select)
        now = time.perf_counter()
        for seq, start, count in plan:
            seq.written = start + count
            seq.blocks.commit(seq.tokens, seq.written)
        for row, seq in enumerate(out_rows):
            events.extend((seq, event) for event in self._advance(seq, row, select, now))
        return events

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
        ids, step, rows = ws.ids.view(np.uint32), ws.step.view(np.uint32), ws.rows.view(np.uint32)
        t, out = 0, []
        for seq, start, count in plan:
            ids[t:t + count] = seq.tokens[start:start + count]
            pairs = step[2 * t:2 * (t + count)].reshape(count, 2)
            pairs[:, 0], pairs[:, 1] = seq.slot, np.arange(start, start + count)
            self.kv.write_table(seq.slot, seq.blocks)
            t += count
            if start + count == len(seq.tokens):
                rows[len(out)] = t - 1
                out.append(seq)
        masked = any(seq.matcher is not None for seq in out)
        for row, seq in enumerate(out if masked else ()):
            words = self.runner.mask_words(row)
            if seq.matcher is None:
                words[:] = ALL_ALLOWED
            else:
                seq.matcher.fill(words)
        if not out:
            return "logits"   # no logits rows: nothing to select
        # whole rows to the host only for a sampler that reads them or for logprobs' normaliser
        host = any(seq.select == "logits" or seq.request.logprobs is not None for seq in out)
        return (("topk" if any(seq.select == "topk" for seq in out) else "argmax") + (MASKED if masked else "")
                + (HOST if host else ""))

    def _advance(self, seq: Sequence, row: int, select: str, now: float):
        """The events of the token seq picks from logits row `row`: the token's, and its last if it ends."""
        token = next_token(self.runner, seq.sampler, select, seq.tokens, row)
        logprobs = None if seq.request.logprobs is None else token_logprobs(
            self.runner.read_logits(row), token, *self.runner.read_topk(row), seq.request.logprobs)
        seq.generated += 1
        seq.first_token_at = seq.first_token_at or now
        if token in self.engine.tokenizer.eog_ids:
            return [self._finish(seq, "stop")]
        seq.tokens.append(token)
        if seq.matcher is not None:
            seq.matcher.accept(token)
        text, seq.matched_stop = seq.stops.push(seq.decoder.push(token))
        events = [Event(text, token, logprobs=logprobs)]
        if seq.matched_stop:
            events.append(self._finish(seq, "stop"))
        elif seq.generated >= seq.request.params.max_tokens or len(seq.tokens) >= self.engine.n_ctx:
            events.append(self._finish(seq, "length"))
        return events

    def _leave(self, seq: Sequence):
        """seq gives back its slot and blocks (its full written blocks stay cached)."""
        if seq.admitted_now:
            seq.blocks.commit(seq.tokens, seq.written)
            seq.blocks.release()
            self.kv.give_slot(seq.slot)
            self._running.remove(seq)
            seq.slot, seq.blocks = None, None

    def _finish(self, seq: Sequence, reason: str) -> Event:
        self._leave(seq)
        if seq in self._waiting:
            self._waiting.remove(seq)
        seq.done = True
        tail = "" if seq.matched_stop else seq.stops.push(seq.decoder.flush())[0] + seq.stops.flush()
        now = time.perf_counter()
        first = seq.first_token_at or now
        timings = Timings(prompt_tokens=len(seq.request.ids), generated_tokens=seq.generated,
                          prompt_seconds=first - (seq.admitted or now), generation_seconds=now - first,
                          time_to_first_token=first - seq.added)
        return Event(tail, None, reason, timings)
