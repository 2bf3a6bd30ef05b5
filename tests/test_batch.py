"""Continuous batching (worker/engine/batch.py) on tiny synthetic models: sequences of different
lengths and sampling parameters decoded together give what each gives alone (Engine.generate,
itself checked against the numpy reference in test_engine.py, and the reference's own greedy
continuation here); joins, leaves, cancellation, prefix reuse and memory pressure."""
import dataclasses

import numpy as np
import pytest
from refmodel import RefModel

from worker.engine.batch import Request
from worker.engine.engine import Engine
from worker.engine.errors import PromptTooLong
from worker.engine.kvblocks import BLOCK_TOKENS
from worker.engine.modelfile import ModelFile
from worker.engine.runner import recorded_size
from worker.engine.sampling import SamplingParams
from worker.tools.synth import write_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_model("tiny-llama", tmp_path_factory.mktemp("batch") / "tiny-llama-Q8_0.gguf", mix="Q8_0", seed=1)


@pytest.fixture
def engine(request, vk_ctxs, vk_settings, model_path):
    """Passes of up to 8 tokens, so prompts past that are prefilled over several steps; on one
    context, or split across the number of them a test's indirect parameter says."""
    contexts = getattr(request, "param", 1)
    engine = Engine.load(model_path, dataclasses.replace(vk_settings, max_sequences=4), n_ctx=96,
                         ctx=vk_ctxs[:contexts], max_batch=8)
    yield engine
    engine.close()


def prompt(length: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 380, length).tolist()


def alone(engine, request: Request) -> list:
    """Events of the request run alone through Engine.generate."""
    return list(engine.generate_ids(request.ids, request.params, logprobs=request.logprobs))


def run(batch, joins: dict[int, list[tuple[str, Request]]], max_steps=400):
    """Steps the batch until it is empty, adding joins[k] before step k; events by name, and the
    names that had an event at each step."""
    seqs, events, active = {}, {}, []
    for k in range(max_steps):
        for name, request in joins.get(k, []):
            seqs[name] = batch.add(request, tag=name)
            events[name] = []
        if not len(batch) and k > max(joins):
            return events, active
        stepped = batch.step()
        active.append({seq.tag for seq, _ in stepped})
        for seq, event in stepped:
            events[seq.tag].append(event)
    raise AssertionError("the batch did not finish")


def tokens(events) -> list[int]:
    return [e.token_id for e in events if e.token_id is not None]


REQUESTS = {
    "short-greedy": Request(prompt(3, 1), GREEDY),
    "long-greedy": Request(prompt(21, 2), dataclasses.replace(GREEDY, max_tokens=9)),
    "topk": Request(prompt(11, 3), SamplingParams(temperature=0.9, top_k=20, top_p=0.9, seed=5, max_tokens=7)),
    "penalties": Request(prompt(6, 4), SamplingParams(temperature=0.8, top_k=0, repeat_penalty=1.3, seed=9,
                                                      max_tokens=5)),
    "logprobs": Request(prompt(17, 5), dataclasses.replace(GREEDY, max_tokens=4), logprobs=3),
}


def test_sequences_decoded_together_give_what_each_gives_alone(engine, model_path):
    expected = {name: alone(engine, r) for name, r in REQUESTS.items()}
    ref = RefModel(ModelFile.open(model_path))
    assert tokens(expected["long-greedy"]) == ref.greedy(REQUESTS["long-greedy"].ids, 9)
    # four at once (max_sequences), the fifth joins when one leaves
    events, _ = run(engine.batch, {0: list(REQUESTS.items())})
    for name, want in expected.items():
        got = events[name]
        assert tokens(got) == tokens(want), name
        assert "".join(e.text for e in got) == "".join(e.text for e in want), name
        assert got[-1].finish_reason == want[-1].finish_reason
        assert got[-1].timings.generated_tokens == want[-1].timings.generated_tokens
    for got, want in zip(events["logprobs"][:-1], expected["logprobs"][:-1]):
        assert got.logprobs.top[0][0] == want.logprobs.top[0][0]
        assert got.logprobs.logprob == pytest.approx(want.logprobs.logprob, abs=1e-3)
    assert len(engine.batch) == 0 and engine.batch.stats()["kv_blocks_used"] == 0
    # passes of 1..8 tokens and 1..4 logits rows, each recorded for its size's power of two
    sizes = {size for n, _, rows, _ in engine.runner.recorded_passes() for size in (n, rows) if size is not None}
    assert sizes <= {0, 1, 2, 4, 8} and 8 in sizes, engine.runner.recorded_passes()


def test_sequences_end_at_the_context_with_fed_passes_in_flight(engine):
    """Greedy sequences decoded with fed passes queued ahead end where the context (96) or
    max_tokens does, as alone, with no pass queued past their last position: the longest holds
    the context's 6 blocks at most, and none are left held."""
    requests = {"context": Request(prompt(70, 11), dataclasses.replace(GREEDY, max_tokens=100)),
                "tokens": Request(prompt(9, 12), dataclasses.replace(GREEDY, max_tokens=30))}
    expected = {name: alone(engine, r) for name, r in requests.items()}
    assert [len(tokens(expected[name])) for name in requests] == [96 - 70, 30]
    batch, pool = engine.batch, engine.kv.pool
    seqs = {name: batch.add(r, tag=name) for name, r in requests.items()}
    events = {name: [] for name in requests}
    held, in_flight = 0, 0
    while len(batch):
        for seq, event in batch.step():
            events[seq.tag].append(event)
        held = max(held, max((len(s.blocks.blocks) for s in seqs.values() if s.blocks is not None), default=0))
        in_flight = max(in_flight, sum(fed.best is None for fed in batch._fed))
    for name, want in expected.items():
        assert tokens(events[name]) == tokens(want), name
        assert events[name][-1].finish_reason == want[-1].finish_reason == "length"
    assert in_flight == 2 and held == 96 // BLOCK_TOKENS and pool.used == 0


@pytest.mark.parametrize("count, capacity, size", [(0, 8, 0), (1, 8, 1), (2, 8, 2), (3, 8, 4), (5, 8, 8),
                                                   (8, 8, 8), (9, 64, 16), (17, 64, 24), (33, 36, 36),
                                                   (500, 512, 504)])
def test_passes_are_recorded_for_a_few_sizes(count, capacity, size):
    assert recorded_size(count, capacity) == size


def test_joins_mid_batch_are_prefilled_while_the_others_stream(engine):
    first = {"a": Request(prompt(4, 6), dataclasses.replace(GREEDY, max_tokens=12)),
             "b": Request(prompt(9, 7), dataclasses.replace(GREEDY, max_tokens=12))}
    late = {"c": Request(prompt(40, 8), dataclasses.replace(GREEDY, max_tokens=3))}
    events, active = run(engine.batch, {0: list(first.items()), 4: list(late.items())})
    # run alone after (before, c's prompt would be cached and not prefilled in the batch)
    expected = {name: tokens(alone(engine, r)) for name, r in (first | late).items()}
    for name, want in expected.items():
        assert tokens(events[name]) == want, name
    # greedy decode steps queue the next pass themselves, fed on the GPU (not while c joins)
    assert engine.batch.stats()["fed_passes"] > 0
    # c's 40 tokens take several passes of 8 (less the decode tokens); a and b get a token in each
    c_first = next(k for k, names in enumerate(active) if "c" in names)
    assert c_first >= 4 + 40 // 8
    assert all({"a", "b"} <= active[k] for k in range(4, c_first))


def test_cancelled_sequence_stops_and_the_others_continue(engine):
    requests = {name: Request(prompt(5 + i, 10 + i), dataclasses.replace(GREEDY, max_tokens=10))
                for i, name in enumerate("abc")}
    expected = {name: tokens(alone(engine, r)) for name, r in requests.items()}
    batch = engine.batch
    seqs = {name: batch.add(r, tag=name) for name, r in requests.items()}
    got = {name: [] for name in requests}
    for _ in range(4):
        for seq, event in batch.step():
            got[seq.tag].append(event)
    batch.cancel(seqs["b"])
    while len(batch):
        for seq, event in batch.step():
            got[seq.tag].append(event)
    assert got["b"][-1].finish_reason == "cancelled" and seqs["b"].done
    assert tokens(got["b"]) == expected["b"][:len(tokens(got["b"]))] and len(tokens(got["b"])) < 10
    for name in "ac":
        assert tokens(got[name]) == expected[name]


def test_shared_prefix_is_not_prefilled_again(engine, vk_ctx, vk_settings, model_path):
    """A second prompt sharing 2 full blocks with a finished one holds those blocks: the hit
    counter says so and its tokens and logprobs are those of a run from an empty cache."""
    system = prompt(2 * BLOCK_TOKENS + 5, 20)
    first, second = system + prompt(3, 21), system[:2 * BLOCK_TOKENS + 2] + prompt(7, 22)
    params = dataclasses.replace(GREEDY, max_tokens=5)
    fresh = Engine.load(model_path, vk_settings, n_ctx=96, ctx=vk_ctx, max_batch=8)
    try:
        expected = alone(fresh, Request(second, params, logprobs=2))
    finally:
        fresh.close()
    batch = engine.batch
    before = batch.stats()["prefix_hit_tokens"]
    run(batch, {0: [("first", Request(first, params))]})
    events, _ = run(batch, {0: [("second", Request(second, params, logprobs=2))]})
    assert batch.stats()["prefix_hit_tokens"] - before == 2 * BLOCK_TOKENS
    assert tokens(events["second"]) == tokens(expected)
    for got, want in zip(events["second"][:-1], expected[:-1]):
        assert got.logprobs.logprob == pytest.approx(want.logprobs.logprob, abs=1e-4)
    # Engine.generate reuses what the batch cached: second's prompt and its first 4 generated
    # tokens (45, written by the batch) hold 2 full blocks, both hits
    again = alone(engine, Request(second + tokens(expected)[:4], params))
    assert batch.stats()["prefix_hit_tokens"] - before == 2 * BLOCK_TOKENS + 2 * BLOCK_TOKENS
    assert tokens(again)[:1] == tokens(expected)[4:5]


def test_memory_pressure_preempts_and_evicts(engine):
    """With most of the pool held elsewhere (by a holder of blocks outside the batch), two growing
    sequences cannot both keep their blocks: the newer is preempted and recomputed later, and
    both still give what they give alone. Holding the whole pool evicts every cached block, so
    the same prompt then hits nothing."""
    requests = {name: Request(prompt(20, 30 + i), dataclasses.replace(GREEDY, max_tokens=24))
                for i, name in enumerate("ab")}
    expected = {name: tokens(alone(engine, r)) for name, r in requests.items()}
    pool = engine.kv.pool
    elsewhere = engine.kv.sequence()
    # 4 blocks left: a and b take 2 each for their prompts, and need 3 each at the end
    assert elsewhere.reserve((pool.n_blocks - 4) * BLOCK_TOKENS)
    preemptions = engine.batch.preemptions
    try:
        events, _ = run(engine.batch, {0: list(requests.items())})
    finally:
        elsewhere.release()
    assert engine.batch.preemptions > preemptions
    for name, want in expected.items():
        assert tokens(events[name]) == want, name
    assert pool.cached > 0
    assert elsewhere.reserve(pool.n_blocks * BLOCK_TOKENS)
    assert pool.cached == 0 and pool.available == 0
    elsewhere.release()
    before = pool.hit_tokens
    run(engine.batch, {0: [("a", requests["a"])]})
    assert pool.hit_tokens == before


def test_bad_requests_are_refused_at_add(engine):
    batch = engine.batch
    with pytest.raises(PromptTooLong):
        batch.add(Request(prompt(96, 1), GREEDY))
    with pytest.raises(Exception, match="empty"):
        batch.add(Request([], GREEDY))
    assert len(batch) == 0 and batch.room()


def test_batch_bench_holds_the_blocks_its_sequences_need(engine):
    """`vkllm bench --batch`'s run: 3 sequences of 5-token prompts and 12 tokens each hold at most
    ceil((5 + 11) / 16) = 1 block each (the last token's K/V is never written), and leave none held."""
    from worker.tools.bench_batch import decode_together
    figures = decode_together(engine, 3, 5, 12, seed=0)
    assert figures["blocks"] == 3 and figures["tok_s"] > 0 and figures["tpot_ms"] > 0
    assert engine.batch.stats()["kv_blocks_used"] == 0


def test_batch_bench_warms_up_then_prints_a_row_per_size(engine, capsys):
    """`vkllm bench --batch 1,3`: the largest batch decoded for the warm-up first, then a row per
    size with its ratio to one sequence."""
    from worker.tools.bench_batch import run
    rows = run(engine, [1, 3], 5, 8, 1, warmup=0.01)
    lines = capsys.readouterr().out.splitlines()
    assert set(rows) == {1, 3} and all(r["tok_s"] > 0 for r in rows.values())
    assert lines[0].split()[:3] == ["sequences", "decode", "tok/s"]
    assert [line.split()[0] for line in lines[1:]] == ["1", "3"]
    assert float(lines[2].split()[2]) == pytest.approx(rows[3]["tok_s"] / rows[1]["tok_s"], abs=0.01)
    assert engine.batch.stats()["kv_blocks_used"] == 0


@pytest.mark.parametrize("env, expected", [({}, (16, "f16")), ({"VKLLM_MAX_SEQUENCES": "32", "VKLLM_KV_TYPE": "Q8_0"},
                                                                  (32, "q8_0"))])
def test_batch_settings_from_the_environment(env, expected):
    from worker.engine.config import Settings
    settings = Settings.from_env(env)
    assert (settings.max_sequences, settings.kv_type) == expected


@pytest.mark.parametrize("env, message", [({"VKLLM_MAX_SEQUENCES": "0"}, "VKLLM_MAX_SEQUENCES must be a positive"),
                                          ({"VKLLM_MAX_SEQUENCES": "many"}, "VKLLM_MAX_SEQUENCES must be a positive"),
                                          ({"VKLLM_KV_TYPE": "q4_0"}, "VKLLM_KV_TYPE must be one of f16, q8_0")])
def test_bad_batch_settings_are_refused(env, message):
    from vkllm.errors import VkllmError
    from worker.engine.config import Settings
    with pytest.raises(VkllmError, match=message):
        Settings.from_env(env)


@pytest.mark.parametrize("engine", [1, 2], indirect=True)
def test_random_joins_under_memory_pressure_give_what_each_gives_alone(engine):
    """Seven sequences joining at random steps, three slots, passes of 8 tokens and a pool cut to
    6 free blocks: joins wait, prefill chunks shrink, sequences are preempted and recomputed,
    and every one still gives what it gives alone."""
    rng = np.random.default_rng(42)
    requests = {f"s{i}": Request(prompt(int(rng.integers(1, 30)), 50 + i),
                                 dataclasses.replace(GREEDY, max_tokens=int(rng.integers(2, 20))))
                for i in range(7)}
    joins = {}
    for name, request in requests.items():
        joins.setdefault(int(rng.integers(0, 25)), []).append((name, request))
    pool = engine.kv.pool
    elsewhere = engine.kv.sequence()
    assert elsewhere.reserve((pool.n_blocks - 6) * BLOCK_TOKENS)
    try:
        events, _ = run(engine.batch, joins)
    finally:
        elsewhere.release()
    assert engine.batch.preemptions > 0
    for name, request in requests.items():
        assert tokens(events[name]) == tokens(alone(engine, request)), name
    assert pool.used == 0


@pytest.mark.parametrize("engine", [1, 2], indirect=True)
def test_a_generation_between_two_steps_leaves_the_batch_right(engine):
    """Engine.generate may run between two batch steps, even with a fed pass in flight: it waits
    for the pass, whose tokens the batch has taken, and the batch goes on as if alone."""
    requests = {name: Request(prompt(6 + i, 60 + i), dataclasses.replace(GREEDY, max_tokens=8))
                for i, name in enumerate("ab")}
    expected = {name: tokens(alone(engine, r)) for name, r in requests.items()}
    between = Request(prompt(9, 70), dataclasses.replace(GREEDY, max_tokens=5))
    between_alone = tokens(alone(engine, between))
    batch = engine.batch
    for name, r in requests.items():
        batch.add(r, tag=name)
    got = {name: [] for name in requests}
    for k in range(100):
        if not len(batch):
            break
        for seq, event in batch.step():
            got[seq.tag].append(event)
        if k == 3:
            # fed passes on the GPU now: two, one where the host orders the stages of a split
            one = len(engine.runner.stages) == 1
            assert [fed.best for fed in batch._fed] == [None] * (2 if one or engine.runner._timeline else 1)
            assert tokens(alone(engine, between)) == between_alone
    assert {name: tokens(e) for name, e in got.items()} == expected
