"""Batched decode through the mat-cols kernel (Settings.batch_kernel "mat_cols"; the default
"auto" takes it on GPUs only, "mat_vec" nowhere): tiny Q4_K_M models' batched passes take it, and
sequences decoded together give the tokens each gives alone (one column: the mat-vec kernel)
and the numpy reference's greedy continuation; Gemma 3's GeGLU and Qwen2's Q/K/V biases too."""
import dataclasses

import numpy as np
import pytest
from refmodel import RefModel

from tests.kernel_io import own_context
from tests.test_batch import GREEDY, alone, prompt, run, tokens
from tests.test_engine_mmq import TOL
from vkllm.errors import VkllmError
from worker.engine.batch import Request
from worker.engine.config import Settings
from worker.engine.engine import Engine
from worker.engine.kernels.paths import mat_mat_path
from worker.engine.modelfile import ModelFile
from worker.engine.sampling import SamplingParams
from worker.tools.synth import write_model


@pytest.fixture(scope="module")
def cols_ctx(vk_settings):
    with own_context(dataclasses.replace(vk_settings, batch_kernel="mat_cols")) as ctx:
        yield ctx


def load(ctx, settings, path):
    return Engine.load(path, dataclasses.replace(settings, max_sequences=5), n_ctx=96, ctx=ctx, max_batch=8)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_model("tiny-llama", tmp_path_factory.mktemp("cols") / "tiny-llama-Q4_K_M.gguf", seed=2)


@pytest.fixture(scope="module")
def engine(cols_ctx, vk_settings, model_path):
    engine = load(cols_ctx, vk_settings, model_path)
    yield engine
    engine.close()


def test_batched_passes_take_the_mat_cols_kernel(engine):
    for n in (1, 5):
        kernels = engine.runner.profile(n)
        cols = [k for k in kernels if k.startswith("mul_mat_cols")]
        assert bool(cols) == (n > 1), kernels
        if n > 1:   # Q/K/V as one product, gate+up fused, the rest plain (Q4_K and Q6_K)
            assert {"mul_mat_cols_qkv_c8_q4_k", "mul_mat_cols_glu_c8_q4_k"} <= set(cols), cols


def decode_together_and_alone(engine, path, near_ties: bool = False) -> tuple[dict, dict, dict]:
    """Four greedy requests and a top-k one, each run alone, then all in one batch: (requests,
    events alone, events together) by name. The alone greedy continuation of the longest prompt
    is the numpy reference's (`near_ties`: up to a near-tie of the reference's logits)."""
    def ids(length, seed):
        return [t % engine.config.vocab_size for t in prompt(length, seed)]
    requests = {f"greedy{i}": Request(ids(3 + 4 * i, 10 + i), dataclasses.replace(GREEDY, max_tokens=8))
                for i in range(4)}
    requests["topk"] = Request(ids(9, 20), SamplingParams(temperature=0.9, top_k=20, seed=3, max_tokens=8))
    expected = {name: alone(engine, r) for name, r in requests.items()}
    ref, longest = RefModel(ModelFile.open(path)), requests["greedy3"].ids
    if near_ties:
        assert_same_up_to_a_near_tie(lambda ids: ref.logits(ids)[-1], longest, ref.greedy(longest, 8),
                                     tokens(expected["greedy3"]))
    else:
        assert tokens(expected["greedy3"]) == ref.greedy(longest, 8)
    events, _ = run(engine.batch, {0: list(requests.items())})
    return requests, expected, events


def check_together_and_alone(engine, path):
    _, expected, events = decode_together_and_alone(engine, path)
    for name, want in expected.items():
        assert tokens(events[name]) == tokens(want), name


def assert_same_up_to_a_near_tie(last_logits, ids: list[int], want: list[int], got: list[int]):
    """`got` is `want`, or parts from it first where `want`'s two best logits (`last_logits(ids)`:
    the last position's) lie within TOL of the largest logit: kernels that round activations
    differently (8-bit or f16 x against f32) move logits by up to that much
    (tests/test_engine_mmq.py)."""
    for step, (a, b) in enumerate(zip(got, want)):
        if a != b:
            logits = last_logits(ids + want[:step])
            second, first = np.sort(logits)[-2:]
            assert first - second < TOL * np.abs(logits).max(), f"{got} parts from {want} at step {step}"
            return
    assert got == want


def test_sequences_decoded_together_give_what_each_gives_alone(engine, model_path):
    check_together_and_alone(engine, model_path)


@pytest.mark.parametrize("preset, kernel", [("tiny-gemma3", "mul_mat_cols_geglu_c8_"),
                                            ("tiny-qwen2", "mul_mat_cols_qkv_c8_")])
def test_other_families(cols_ctx, vk_settings, tmp_path, preset, kernel):
    path = write_model(preset, tmp_path / f"{preset}-Q4_K_M.gguf", seed=4)
    engine = load(cols_ctx, vk_settings, path)
    try:
        assert any(k.startswith(kernel) for k in engine.runner.profile(5))
        check_together_and_alone(engine, path)
    finally:
        engine.close()


@pytest.mark.parametrize("value, expected", [("", "auto"), ("MAT_COLS", "mat_cols"), ("mat_vec", "mat_vec")])
def test_batch_kernel_from_the_environment(value, expected):
    assert Settings.from_env({"VKLLM_BATCH_KERNEL": value}).batch_kernel == expected


def test_bad_batch_kernel_is_refused():
    with pytest.raises(VkllmError, match="VKLLM_BATCH_KERNEL must be one of auto, mat_vec, mat_cols, mat_mat"):
        Settings.from_env({"VKLLM_BATCH_KERNEL": "coopmat"})


def test_bench_prints_each_pass_and_its_kernels(engine, capsys):
    """`vkllm bench --batch 1,5 --profile`'s pass table."""
    from worker.tools.bench_batch import print_pass_profiles
    before = engine.kv.stats()
    print_pass_profiles(engine, [1, 5], 10)
    assert engine.kv.stats() == before   # the profiled sequences gave their blocks back
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "one decode step of n sequences at position 10 (batch kernel: mat_cols):"
    assert lines[1].startswith("  n=  1:") and "mul_mat_cols" not in lines[1]
    assert lines[2].startswith("  n=  5:") and "mul_mat_cols_glu_c8_q4_k" in lines[2]


def test_decode_passes_append_their_kv_in_attention(engine):
    """A batched decode pass (one token a sequence, as the fed passes and Runner.profile_decode
    record it) has no rope_store_kv: attention rotates and appends each token's K/V
    (attention.takes_rope's `distinct`); a prefill chunk of one sequence keeps rope_store_kv."""
    layers = engine.config.n_layer
    decode, chunk = engine.runner.profile_decode(5, 10), engine.runner.profile(5)
    assert not any(k.startswith("rope_store_kv") for k in decode), decode
    assert sum(c for k, (c, _) in decode.items() if k.startswith("attention") and "_rope" in k) == layers, decode
    assert sum(c for k, (c, _) in chunk.items() if k.startswith("rope_store_kv")) == layers, chunk
    assert not any(k.startswith("attention") and "_rope" in k for k in chunk), chunk


def test_only_passes_that_append_no_kv_of_their_own_read_host_written_tiles(engine):
    """The fed passes keep two in flight (Runner.fed_depth) unless the pass takes tiled
    attention, whose tile list the host writes into one buffer: a decode pass of 128 sequences or
    more appends its K/V in attention.comp and takes no tiles; a prefill chunk of 128 does."""
    model = engine.runner.model
    assert model.tiled_attention(128) and model.tiled_attention(200)
    assert not model.tiled_attention(127) and not model.tiled_attention(128, distinct=True)


@pytest.mark.parametrize("prefill_kernel", ["auto", "mmq"])
def test_batched_decode_through_the_mat_mat_kernels(vk_settings, model_path, prefill_kernel):
    """batch_kernel "mat_mat": a batch of 5 takes the device's mat-mat kernel (the tiled one on
    lavapipe, cooperative matrices on the H200) or the 8-bit one (mmq, with 8-bit x in decode
    alone too); each greedy sequence gets the tokens it gets alone (one column: the mat-vec
    kernel) up to a near-tie, and the sampled one, whose draws part at any rounding, all 8."""
    settings = dataclasses.replace(vk_settings, batch_kernel="mat_mat", prefill_kernel=prefill_kernel,
                                   decode_kernel="x8" if prefill_kernel == "mmq" else "auto")
    with own_context(settings) as ctx:
        engine = load(ctx, settings, model_path)
        try:
            prefix = {"coopmat": "mul_mat_coopmat_", "mmq": "mul_mmq_", "tiled": "mul_mat_q"}[mat_mat_path(ctx)]
            assert any(k.startswith(prefix) for k in engine.runner.profile(5))
            requests, expected, events = decode_together_and_alone(engine, model_path, near_ties=True)
            for name, request in requests.items():
                if name.startswith("greedy"):
                    assert_same_up_to_a_near_tie(lambda ids: engine.logits(ids)[-1], request.ids,
                                                 tokens(expected[name]), tokens(events[name]))
            assert len(tokens(events["topk"])) == 8
        finally:
            engine.close()
