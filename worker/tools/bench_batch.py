"""`vkllm bench -m FILE --batch 1,8,32`: aggregate decode throughput of N sequences decoded
together through Engine.batch (worker/engine/batch.py), as the issue's acceptance figures state
it: N greedy sequences of short random prompts, joined at once; after all have their first token,
the decode steps are timed. Reports aggregate tokens/s, its ratio to N = 1, the median time per
output token of a sequence and the KV blocks the batch held at most."""
import dataclasses
import statistics
import time

import numpy as np

from worker.engine.batch import Request
from worker.engine.sampling import SamplingParams


def load(path: str, settings, sizes: list[int], n_prompt: int, n_gen: int):
    from worker.engine.engine import Engine
    return Engine.load(path, dataclasses.replace(settings, max_sequences=max(sizes)), n_ctx=n_prompt + n_gen + 16,
                       max_batch=512)


def decode_together(engine, n: int, n_prompt: int, n_gen: int, seed: int) -> dict:
    """One run of n sequences; the figures of its decode phase."""
    rng = np.random.default_rng(seed)
    params = SamplingParams(temperature=0.0, max_tokens=n_gen, ignore_eos=True)   # every sequence makes n_gen
    batch = engine.batch
    for _ in range(n):
        batch.add(Request(rng.integers(0, engine.config.vocab_size, n_prompt).tolist(), params))
    started, generated, tpot, blocks = set(), 0, [], 0
    start = None
    while len(batch):
        for seq, event in batch.step():
            if event.token_id is not None:
                started.add(id(seq))
                generated += start is not None
            if event.finish_reason:
                t = event.timings
                if t.generated_tokens > 1:
                    tpot.append(t.generation_seconds / (t.generated_tokens - 1))
        blocks = max(blocks, batch.stats()["kv_blocks_used"])
        if start is None and len(started) == n:
            start = time.perf_counter()
    seconds = time.perf_counter() - start
    return {"tok_s": generated / seconds, "tpot_ms": 1e3 * statistics.median(tpot), "blocks": blocks,
            "total_blocks": batch.stats()["kv_blocks_total"]}


# Seconds of decoding the largest batch before the first size is timed: an idle H200 drops its
# clock within a second and one sequence's passes alone did not bring it back up (one sequence
# measured 238.5 tok/s after the model load and 281.8 after other GPU work, same build).
WARMUP_SECONDS = 2.0


def warm_up(engine, n: int, n_prompt: int, seconds: float):
    """Decodes batches of n sequences until `seconds` have passed (at least one)."""
    end = time.perf_counter() + seconds
    seed = 0
    while True:
        decode_together(engine, n, n_prompt, 16, seed=2000 + seed)
        seed += 1
        if time.perf_counter() >= end:
            return


def run(engine, sizes: list[int], n_prompt: int, n_gen: int, reps: int, warmup: float = WARMUP_SECONDS):
    rows = {}
    warm_up(engine, max(sizes), n_prompt, warmup)
    for n in sizes:
        decode_together(engine, n, n_prompt, min(n_gen, 16), seed=1000 + n)   # warm-up: recordings, clocks
        runs = [decode_together(engine, n, n_prompt, n_gen, seed=n + 100 * r) for r in range(reps)]
        rows[n] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    one = rows[sizes[0]]["tok_s"] / sizes[0] if sizes[0] == 1 else None
    print(f"{'sequences':>9} {'decode tok/s':>12} {'x one':>6} {'TPOT p50 ms':>11} {'KV blocks':>12}")
    for n, r in rows.items():
        ratio = f"{r['tok_s'] / one:6.2f}" if one else "     -"
        print(f"{n:9d} {r['tok_s']:12.1f} {ratio} {r['tpot_ms']:11.2f} {r['blocks']:5.0f}/{r['total_blocks']:.0f}",
              flush=True)
    return rows


def print_pass_profiles(engine, sizes: list[int], pos: int, top: int = 6):
    """GPU time of one batched decode step of n sequences at position pos for each n, and its
    costliest kernels (Settings.batch_kernel picks the products' kernel)."""
    print(f"one decode step of n sequences at position {pos} (batch kernel: {engine.ctx.settings.batch_kernel}):")
    for n in sizes:
        table = engine.runner.profile_decode(n, pos)
        total = sum(ns for _, ns in table.values())
        costliest = sorted(table.items(), key=lambda item: -item[1][1])[:top]
        print(f"  n={n:3d}: {total / 1e6:8.2f} ms GPU in {sum(c for c, _ in table.values())} dispatches | " +
              ", ".join(f"{name} {ns / 1e6:.2f}" for name, (_, ns) in costliest), flush=True)
