"""A model's layers split across several Vulkan contexts (worker/engine/placement.py,
staged.py): two or three contexts on the one device lavapipe offers, each a VkDevice of its own
(nothing assumes the devices differ). The same kernels run the same layers, so logits, greedy
tokens and a batch's tokens equal the unsplit run's, for every family."""
import dataclasses
import json

import numpy as np
import pytest

from tests.kernel_io import own_context
from worker.engine.batch import Request
from worker.engine.engine import Engine
from worker.engine.modelfile import ModelFile
from worker.engine.placement import shared_budgets, split_layers
from worker.engine.sampling import SamplingParams
from worker.tools.synth import write_model

PRESETS = ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3", "tiny-qwen3moe", "tiny-qwen2moe", "tiny-gpt-oss"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("split")


def _model(synth_dir, preset, mix="Q4_K_M"):
    path = synth_dir / f"{preset}-{mix}.gguf"
    if not path.exists():
        write_model(preset, path, mix=mix, seed=1)
    return path


def test_split_layers_is_contiguous_and_proportional():
    assert split_layers(10, [40, 60]) == [range(0, 4), range(4, 10)]
    assert split_layers(32, [1, 1, 1]) == [range(0, 11), range(11, 22), range(22, 32)]
    assert split_layers(2, [1, 1, 1]) == [range(0, 1), range(1, 2), range(2, 2)]
    assert split_layers(6, [0, 1]) == [range(0, 0), range(0, 6)]
    # contexts on one device share its free memory
    assert shared_budgets([900, 900, 500, 900], [0, 0, 1, 0]) == [300, 300, 500, 300]


def _on(ctx, buffer) -> bool:
    return buffer.block in ctx.device_pool.blocks or buffer.block in ctx.host_pool.blocks


@pytest.mark.parametrize("preset", PRESETS)
def test_split_logits_equal_the_unsplit_run(vk_ctxs, synth_dir, preset):
    path = _model(synth_dir, preset)
    ids = np.random.default_rng(2).integers(0, ModelFile.open(path).config.vocab_size, 11).tolist()
    results = {}
    for n in (1, 2, 3):
        engine = Engine.load(path, n_ctx=64, ctx=vk_ctxs[:n], max_batch=16)
        try:
            # each layer's weights and KV cache are on its stage's context
            for stage in engine.placement:
                for i in stage.layers:
                    assert _on(stage.ctx, engine.kv.layers[i].k)
                    assert _on(stage.ctx, engine.model.layers[i]["attn_norm"])
            assert _on(vk_ctxs[n - 1], engine.model.globals["output_norm"])
            results[n] = engine.logits(ids), list(engine.generate_ids(ids, GREEDY))
        finally:
            engine.close()
    logits, events = results[1]
    for n in (2, 3):
        np.testing.assert_allclose(results[n][0], logits, rtol=0, atol=1e-5 * np.abs(logits).max())
        assert [e.token_id for e in results[n][1]] == [e.token_id for e in events]


def _batch_tokens(engine, requests) -> dict:
    seqs = {name: engine.batch.add(request, tag=name) for name, request in requests.items()}
    out = {name: [] for name in seqs}
    for _ in range(200):
        if not len(engine.batch):
            return out
        for seq, event in engine.batch.step():
            if event.token_id is not None:
                out[seq.tag].append(event.token_id)
    raise AssertionError("the batch did not finish")


def test_split_batch_gives_the_unsplit_tokens(vk_ctxs, vk_settings, synth_dir):
    """Several sequences, prefilled over several passes (chunks of 8), greedy ones fed on the GPU
    between steps, a sampled one with logprobs: the same tokens split 2 and 3 ways."""
    path = _model(synth_dir, "tiny-gemma3")
    rng = np.random.default_rng(4)
    requests = {"a": Request(rng.integers(3, 380, 3).tolist(), GREEDY),
                "b": Request(rng.integers(3, 380, 19).tolist(), dataclasses.replace(GREEDY, max_tokens=9)),
                "c": Request(rng.integers(3, 380, 7).tolist(),
                             SamplingParams(temperature=0.9, top_k=20, seed=5, max_tokens=5, ignore_eos=True),
                             logprobs=2)}
    settings = dataclasses.replace(vk_settings, max_sequences=4)
    results = {}
    for n in (1, 2, 3):
        engine = Engine.load(path, settings, n_ctx=64, ctx=vk_ctxs[:n], max_batch=8)
        try:
            results[n] = _batch_tokens(engine, requests)
            assert n == 1 or engine.batch.fed_passes > 0
        finally:
            engine.close()
    assert results[2] == results[1] and results[3] == results[1]
    assert all(len(tokens) == requests[name].params.max_tokens for name, tokens in results[1].items())


def test_devices_and_split_from_the_environment_and_the_commands(monkeypatch):
    from vkllm.cli import build_parser
    from worker.engine.config import Settings
    from worker.tools.devices import settings
    env = Settings.from_env({"VKLLM_DEVICES": "0, 1", "VKLLM_SPLIT": "40,60"})
    assert (env.devices, env.split) == (("0", "1"), (40.0, 60.0))
    assert (Settings.from_env({}).devices, Settings.from_env({}).split) == (None, None)
    monkeypatch.setenv("VKLLM_DEVICES", "0,0,0")
    parser = build_parser()
    for command in (["worker", "-m", "x.gguf"], ["generate", "-m", "x.gguf", "-p", "hi"], ["bench", "-m", "x.gguf"]):
        assert settings(parser.parse_args(command)).devices == ("0", "0", "0")   # the environment's
        args = parser.parse_args([*command, "--devices", "1,0", "--split", "1,3"])
        assert (settings(args).devices, settings(args).split) == (("1", "0"), (1.0, 3.0))
    from appliance.embedded import worker_command
    up = parser.parse_args(["up", "--devices", "0,1", "--split", "40,60", "--gpu-memory-utilization", "0.8"])
    assert worker_command(up, "redis://r", ["m.gguf"])[-6:] == ["--devices", "0,1", "--split", "40,60",
                                                                 "--gpu-memory-utilization", "0.8"]
    assert "--devices" not in worker_command(parser.parse_args(["up"]), "redis://r", ["m.gguf"])


@pytest.mark.parametrize("env, message", [
    ({"VKLLM_DEVICES": "0,,1"}, "comma-separated list of indices"),
    ({"VKLLM_SPLIT": "40,x"}, "comma-separated non-negative shares"),
    ({"VKLLM_SPLIT": "0,0"}, "comma-separated non-negative shares"),
    ({"VKLLM_DEVICES": "0,1", "VKLLM_SPLIT": "1,2,3"}, "a split of 3 shares needs as many devices, not 2"),
    ({"VKLLM_SPLIT": "1,2"}, "a split of 2 shares needs as many devices, not 1")])
def test_bad_devices_or_split_are_refused(env, message):
    from vkllm.errors import VkllmError
    from worker.engine.config import Settings
    with pytest.raises(VkllmError, match=message):
        Settings.from_env(env)


def test_split_with_an_8bit_kv_cache_and_a_grammar_equals_the_unsplit_run(vk_ctxs, vk_settings, tiny_model):
    """The q8_0 cache's scales live with each layer's pools; a grammar's mask is applied on the
    last stage, before its selection: constrained greedy text (alone, and two in a batch) and
    8-bit-cache logits are the unsplit run's."""
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                               "size": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["color", "size"], "additionalProperties": False}
    constraint = {"type": "json_schema", "schema": schema}
    params = SamplingParams(temperature=0.0, max_tokens=40)
    ids = np.random.default_rng(7).integers(3, 380, 9).tolist()
    settings = dataclasses.replace(vk_settings, kv_type="q8_0", max_sequences=2)
    results = {}
    for n in (1, 2):
        engine = Engine.load(tiny_model, settings, n_ctx=128, ctx=vk_ctxs[:n], max_batch=16)
        try:
            alone = [e.text for e in engine.generate("Describe a ball as JSON:", params, constraint=constraint)]
            batched = _batch_tokens(engine, {name: Request(engine.tokenizer.encode(prompt), params,
                                                           constraint=constraint)
                                             for name, prompt in (("a", "A ball:"), ("b", "Another ball, as JSON:"))})
            results[n] = engine.logits(ids), alone, batched
        finally:
            engine.close()
    assert set(json.loads("".join(results[1][1]))) == {"color", "size"}   # the grammar held
    np.testing.assert_allclose(results[2][0], results[1][0], rtol=0, atol=1e-5 * np.abs(results[1][0]).max())
    assert results[2][1:] == results[1][1:]


def _greedy_and_logits(engine, ids, check=None) -> tuple[list[int], np.ndarray]:
    """(greedy tokens, logits) of `ids` on `engine` (after `check(engine)`, if given); closes it."""
    try:
        if check is not None:
            check(engine)
        events = list(engine.generate_ids(ids, GREEDY))
        return [e.token_id for e in events if e.token_id is not None], engine.logits(ids)
    finally:
        engine.close()


def _assert_as_unsplit(split, unsplit):
    assert split[0] == unsplit[0] and len(unsplit[0]) == GREEDY.max_tokens
    np.testing.assert_allclose(split[1], unsplit[1], rtol=0, atol=1e-5 * np.abs(unsplit[1]).max())


def test_split_over_8bit_decode_equals_the_unsplit_run(vk_settings, synth_dir):
    """Under decode_kernel "x8" (a GPU's default) each residual product writes the next norm's
    input where that norm's products are on its context, and the last layer of a stage hands x
    over as it is: greedy tokens (decoded one by one) and logits as unsplit."""
    path = _model(synth_dir, "tiny-llama")
    ids = np.random.default_rng(5).integers(0, ModelFile.open(path).config.vocab_size, 5).tolist()
    settings = dataclasses.replace(vk_settings, decode_kernel="x8")
    with own_context(settings) as first, own_context(settings) as second:
        unsplit, split = (_greedy_and_logits(Engine.load(path, n_ctx=64, ctx=[first, second][:n], max_batch=16), ids)
                          for n in (1, 2))
    _assert_as_unsplit(split, unsplit)


def test_contexts_of_one_device_share_its_logical_device(vk_ctx, vk_settings, synth_dir):
    """A model split over one device named twice (`--devices 0,0`; here by its index, then its
    name) runs its stages on one logical device and queue (engine.open_contexts), ordered by one
    timeline semaphore on any driver: greedy tokens and logits as unsplit, and closing the engine
    closes the device once."""
    from worker.engine.vk.linked import shares_timeline
    path = _model(synth_dir, "tiny-qwen3")
    ids = np.random.default_rng(6).integers(0, ModelFile.open(path).config.vocab_size, 7).tolist()
    settings = dataclasses.replace(vk_settings, devices=(str(vk_ctx.info.index), vk_ctx.info.name))
    ctxs = []

    def on_one_logical_device(engine):
        ctxs[:] = [stage.ctx for stage in engine.placement]
        assert len(ctxs) == 2 and ctxs[0].logical is ctxs[1].logical and shares_timeline(ctxs)

    unsplit = _greedy_and_logits(Engine.load(path, n_ctx=64, ctx=vk_ctx, max_batch=16), ids)
    split = _greedy_and_logits(Engine.load(path, settings, n_ctx=64, max_batch=16), ids, on_one_logical_device)
    assert ctxs[0].logical.users == 0
    _assert_as_unsplit(split, unsplit)


def test_a_split_over_shared_and_separate_logical_devices(vk_ctxs, vk_settings, synth_dir):
    """Two stages on one logical device and a third on a VkDevice of its own (as `--devices 0,0,1`
    gives on two GPUs): the hand-off memory imported once per logical device, the stages ordered
    by the host where no timeline spans them all (lavapipe): greedy tokens and logits as unsplit."""
    path = _model(synth_dir, "tiny-llama")
    ids = np.random.default_rng(7).integers(0, ModelFile.open(path).config.vocab_size, 9).tolist()
    with own_context(vk_settings, block_size=64 << 20, share=vk_ctxs[0]) as shared:
        ctxs = [vk_ctxs[0], shared, vk_ctxs[1]]

        def one_stage_a_context(engine):
            assert [stage.ctx for stage in engine.placement] == ctxs

        unsplit = _greedy_and_logits(Engine.load(path, n_ctx=64, ctx=vk_ctxs[0], max_batch=16), ids)
        split = _greedy_and_logits(Engine.load(path, n_ctx=64, ctx=ctxs, max_batch=16), ids, one_stage_a_context)
    _assert_as_unsplit(split, unsplit)
