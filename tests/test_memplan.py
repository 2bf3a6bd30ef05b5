"""Memory plan numbers recomputed here from the file (gguf.GGUFReader) and the KV formula."""
import pytest
from gguf import GGUFReader

from vkllm.errors import VkllmError
from worker.engine.memplan import MemoryPlan
from worker.engine.modelfile import ModelFile


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return ModelFile.open(smollm2_path)


def test_smollm2_plan(smollm2, smollm2_path):
    plan = MemoryPlan.compute(smollm2, smollm2.config, n_ctx=8192, chunk=512)
    assert plan.weights_bytes == sum(int(t.n_bytes) for t in GGUFReader(smollm2_path).tensors)
    assert plan.kv_bytes == 2 * 30 * 8192 * 3 * 64 * 2 == 188_743_680
    # 512 rows of float32: 2*576 (x, norm) + 2*576 (q, attention out) + 2*192 (k, v) + 2*1536
    # (ffn), 512 token ids and (slot, position) pairs, one logits row of 49152 (one sequence)
    # in host memory and one in device memory (a batched pass's) and its index, the argmax and a
    # second (slot, position) and argmax (greedy decode keeps two steps in flight), 64 top-k ids
    # and values, a grammar's token mask of one bit per token, and the counters of the gate+up
    # products whose last workgroups write the FFN's output in 8-bit blocks (one per 32 of its 1536)
    assert plan.scratch_bytes == (4 * 512 * (2 * 576 + 2 * 576 + 2 * 192 + 2 * 1536) + 4 * 512 + 8 * 512
                                  + 2 * 4 * 49152 + 4 + 2 * 4 + 8 + 2 * 4 * 64 + 49152 // 8 + 4 * (1536 // 32))
    assert plan.total == plan.weights_bytes + plan.kv_bytes + plan.scratch_bytes


def test_fits(smollm2):
    plan = MemoryPlan.compute(smollm2, smollm2.config, n_ctx=2048)
    plan.check(plan.total)


def test_too_long_context_names_the_largest_that_fits(smollm2):
    plan = MemoryPlan.compute(smollm2, smollm2.config, n_ctx=8192)
    per_token = 2 * 30 * 3 * 64 * 2
    budget = plan.weights_bytes + plan.scratch_bytes + 1000 * per_token + 17
    assert plan.largest_context(budget) == 768
    with pytest.raises(VkllmError, match="the largest context that fits is 768 tokens"):
        plan.check(budget)


def test_weights_alone_too_big(smollm2):
    plan = MemoryPlan.compute(smollm2, smollm2.config, n_ctx=512)
    with pytest.raises(VkllmError, match="the weights alone leave no room"):
        plan.check(plan.weights_bytes // 2)


def test_default_context_shrinks_to_what_fits(smollm2):
    from worker.engine.memplan import plan_context
    per_token = 2 * 30 * 3 * 64 * 2
    full = MemoryPlan.compute(smollm2, smollm2.config, n_ctx=4096, chunk=64)
    budget = full.weights_bytes + full.scratch_bytes + 1000 * per_token
    assert plan_context(smollm2, smollm2.config, None, 4096, 64, 10 * full.total).n_ctx == 4096
    assert plan_context(smollm2, smollm2.config, None, 4096, 64, budget).n_ctx == 768
    assert plan_context(smollm2, smollm2.config, None, 10**6, 64, 10 * full.total).n_ctx == 8192  # model's own
    with pytest.raises(VkllmError, match="largest context that fits is 768"):
        plan_context(smollm2, smollm2.config, 4096, 4096, 64, budget)  # asked for explicitly


def test_chunk_grows_up_to_the_context(smollm2):
    from worker.engine.memplan import plan_load
    plan = plan_load(smollm2, smollm2.config, 2048, 4096, (512, 1024, 2048, 4096), 1 << 40)
    assert (plan.n_ctx, plan.chunk) == (2048, 2048)
    # per chunk token a row of activations (4 * 5760 bytes), a token id and a (slot, position), as
    # test_smollm2_plan counts
    small = MemoryPlan.compute(smollm2, smollm2.config, n_ctx=2048, chunk=512)
    assert plan.scratch_bytes - small.scratch_bytes == (2048 - 512) * (4 * 5760 + 4 + 8)


def test_chunk_stays_where_a_bigger_one_would_not_fit(smollm2):
    from worker.engine.memplan import plan_load
    small = MemoryPlan.compute(smollm2, smollm2.config, n_ctx=4096, chunk=512)
    budget = small.total + 1000   # the 1024-token chunk's scratch is ~12 MB more
    plan = plan_load(smollm2, smollm2.config, None, 4096, (512, 1024), budget)
    assert (plan.n_ctx, plan.chunk) == (4096, 512)
    # nor where its scratch would pass 1/16 of the budget (the whole plan fitting)
    bigger = MemoryPlan.compute(smollm2, smollm2.config, n_ctx=4096, chunk=1024)
    assert bigger.total < 16 * bigger.scratch_bytes - 1
    assert plan_load(smollm2, smollm2.config, 4096, 4096, (512, 1024), 16 * bigger.scratch_bytes - 1).chunk == 512
    assert plan_load(smollm2, smollm2.config, 4096, 4096, (512, 1024), 16 * bigger.scratch_bytes).chunk == 1024


def test_the_pool_grows_towards_every_sequence_a_full_context(smollm2):
    """One sequence's context must fit; the pool then takes what the budget leaves (90%), up
    to `sequences` contexts, in whole 16-position blocks; 8-bit KV halves the bytes per
    position (plus a scale per 32 values); the logits rows scale with the sequences."""
    from worker.engine.memplan import plan_context
    per_token = 2 * 30 * 3 * 64 * 2
    one = MemoryPlan.compute(smollm2, smollm2.config, n_ctx=1024, chunk=64, sequences=8)
    assert one.kv_tokens == 1024 and one.kv_bytes == 1024 * per_token
    roomy = plan_context(smollm2, smollm2.config, 1024, 4096, 64, 10 * one.total, sequences=8)
    assert (roomy.kv_tokens, roomy.kv_blocks, roomy.sequences) == (8 * 1024, 512, 8)
    tight = plan_context(smollm2, smollm2.config, 1024, 4096, 64, one.total + 1000 * per_token, sequences=8)
    assert tight.kv_tokens == 1024 + 900 // 16 * 16 and tight.sequences == 8
    assert plan_context(smollm2, smollm2.config, 1024, 4096, 64, 10 * one.total, sequences=8,
                        max_kv_tokens=3000).kv_tokens == 3000 // 16 * 16
    q8 = MemoryPlan.compute(smollm2, smollm2.config, n_ctx=1024, chunk=64, kv_type="q8_0")
    assert q8.kv_bytes == 1024 * 2 * 30 * (192 + 2 * 192 // 32)
    single = MemoryPlan.compute(smollm2, smollm2.config, n_ctx=1024, chunk=64)
    # per sequence: logits rows (host and device), rows, best, top-k ids and values, mask, step_alt, best_alt
    assert one.scratch_bytes - single.scratch_bytes == 7 * (2 * 4 * 49152 + 4 + 4 + 2 * 4 * 64 + 49152 // 8 + 8 + 4)


def test_sequences_are_capped_by_the_pools_blocks(smollm2):
    """Each sequence holds a block at least: a budget with room for one 32-position context
    (2 blocks) serves 2 sequences, however many were asked for."""
    from worker.engine.memplan import plan_context
    budget = MemoryPlan.compute(smollm2, smollm2.config, n_ctx=32, chunk=64, sequences=99).total
    plan = plan_context(smollm2, smollm2.config, 32, 4096, 64, budget, sequences=99)
    assert (plan.kv_tokens, plan.kv_blocks, plan.sequences) == (32, 2, 2)


def test_split_plans_hold_each_devices_layers(smollm2, smollm2_path):
    """30 layers split 10/20: each device's layers' tensors and KV, the embedding table on the
    first, the output norm on the last with its head (SmolLM2's tied table: a second copy), and a
    whole workspace each with the hidden state's hand-off buffer (512 x 576 floats)."""
    from worker.engine.memplan import plan_split
    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(smollm2_path).tensors}
    layer = lambda lo, hi: sum(n for name, n in tensors.items()
                               if name.startswith("blk.") and lo <= int(name.split(".")[1]) < hi)
    plans = plan_split(smollm2, smollm2.config, 2048, 4096, (512,), [1 << 40] * 2, [range(0, 10), range(10, 30)])
    whole = MemoryPlan.compute(smollm2, smollm2.config, n_ctx=2048, chunk=512, sequences=plans[0].sequences,
                               kv_tokens=plans[0].kv_tokens)
    embd, out_norm = tensors["token_embd.weight"], tensors["output_norm.weight"]
    assert plans[0].weights_bytes == layer(0, 10) + embd
    assert plans[1].weights_bytes == layer(10, 30) + embd + out_norm
    assert [p.kv_bytes for p in plans] == [2 * n * plans[0].kv_tokens * 3 * 64 * 2 for n in (10, 20)]
    assert all(p.scratch_bytes == whole.scratch_bytes + 4 * 512 * 576 for p in plans)
    assert [p.describe()["layers"] for p in plans] == [[0, 10], [10, 30]]
    # unasked, layers go in proportion to what each budget leaves besides embeddings and output
    from worker.engine.memplan import layer_shares
    assert layer_shares(smollm2, [10**9, 10**9, 10**9]) == [10**9 - embd, 10**9, 10**9 - embd - out_norm]


def test_a_budget_below_the_weights_is_refused_as_a_model_that_does_not_fit(smollm2_path, vk_settings):
    """Under a utilization that leaves less than the weights (here a KiB), the load is refused by
    the memory plan's message, on one device and on two, not by the layer split before it."""
    from dataclasses import replace

    from worker.engine.engine import Engine
    from worker.engine.vk.context import Context
    probe = Context(vk_settings)
    try:
        used, total = probe.memory_budget()
    finally:
        probe.close()
    settings = replace(vk_settings, gpu_memory_utilization=(used + 1024) / total)
    for devices in ((vk_settings.device,), (vk_settings.device,) * 2):
        with pytest.raises(VkllmError, match="model does not fit: .*the weights alone leave no room"):
            Engine.load(smollm2_path, replace(settings, devices=devices), n_ctx=256)


def test_split_refusal_names_the_device_and_the_largest_context_all_fit(smollm2):
    """A small second device: the plan is refused on it, naming the context every device fits."""
    from worker.engine.memplan import plan_split
    ranges = [range(0, 10), range(10, 30)]
    one = [MemoryPlan.compute(smollm2, smollm2.config, 4096, 64, layers=r, first=i == 0, last=i == 1)
           for i, r in enumerate(ranges)]
    per_token = 2 * 20 * 3 * 64 * 2   # the second device's 20 layers
    budgets = [1 << 40, one[1].weights_bytes + one[1].scratch_bytes + 1000 * per_token]
    with pytest.raises(VkllmError, match=r"on device 1 of the split \(layers 10-29\) it needs .* the largest "
                                         r"context that fits is 768 tokens"):
        plan_split(smollm2, smollm2.config, 4096, 4096, (64,), budgets, ranges)
    # without a context asked for, the default shrinks to it
    assert plan_split(smollm2, smollm2.config, None, 4096, (64,), budgets, ranges)[0].n_ctx == 768
    with pytest.raises(VkllmError, match=r"on device 0 of the split \(layers 0-9\).*weights alone leave no room"):
        plan_split(smollm2, smollm2.config, None, 4096, (64,), [one[0].weights_bytes, 1 << 40], ranges)


def test_a_context_past_the_models_takes_the_models_with_a_warning(smollm2, caplog):
    from worker.engine.memplan import plan_split
    plans = plan_split(smollm2, smollm2.config, 20000, 4096, (64,), [1 << 40], [None])
    assert plans[0].n_ctx == smollm2.config.context_length == 8192
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "a context of 20000 positions was asked; the model was trained for 8192 and takes that"]
    caplog.clear()
    assert plan_split(smollm2, smollm2.config, 8192, 4096, (64,), [1 << 40], [None])[0].n_ctx == 8192
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
