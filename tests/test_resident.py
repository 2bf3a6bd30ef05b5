"""Several models in one worker share the device's memory (worker/engine/resident.py), within the
share of it that Settings.gpu_memory_utilization allows. The budget here is set through that
setting on lavapipe's 2 GiB heap; each model's own plan (MemoryPlan) is the reference for what it
holds."""
from dataclasses import replace

import pytest

from vkllm.errors import VkllmError
from worker.engine.config import Settings
from worker.engine.engine import Engine, prefill_chunks
from worker.engine.memplan import PREFILL_CHUNK, MemoryPlan
from worker.engine.modelfile import ModelFile
from worker.engine.resident import load_resident
from worker.engine.sampling import SamplingParams
from worker.engine.vk.context import Context

N_CTX = 2048
BUDGET = 40 << 20   # two tiny models' weights, contexts and scratch, and some 10 MiB of KV pool each


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    from worker.tools.synth import write_model
    folder = tmp_path_factory.mktemp("resident")
    return [write_model("tiny-llama", folder / f"{name}.gguf") for name in ("first", "second")]


@pytest.fixture(scope="module")
def tight(vk_settings):
    """Settings whose utilization leaves BUDGET of the device's heap to the models, beyond what
    this process holds already (the session's context, on a GPU)."""
    ctx = Context(vk_settings)
    try:
        used, total = ctx.memory_budget()
        held = used - ctx.device_pool.reserved
    finally:
        ctx.close()
    return replace(vk_settings, gpu_memory_utilization=(held + BUDGET) / total)


@pytest.fixture(scope="module")
def chunk(vk_session) -> int:
    """The prefill chunk an engine's memory plan starts from on this device."""
    return prefill_chunks([vk_session])[0]


def one_context_bytes(path, chunk: int) -> int:
    model = ModelFile.open(path)
    return MemoryPlan.compute(model, model.config, N_CTX, chunk=chunk).total


def test_without_room_kept_the_first_pool_takes_what_the_second_model_needs(two_models, tight):
    """What load_resident prevents: loaded alone, the first model's KV pool grows into 90% of
    what its weights leave, and the second, at the same context, no longer fits (both in chunks
    of PREFILL_CHUNK: the 10% left would hold a plan of CPU_PREFILL_CHUNK's smaller scratch)."""
    ctx = Context(tight)
    try:
        first = Engine.load(two_models[0], tight, n_ctx=N_CTX, ctx=ctx, max_batch=PREFILL_CHUNK)
        try:
            assert ctx.available(tight.gpu_memory_utilization) < one_context_bytes(two_models[1], PREFILL_CHUNK)
            with pytest.raises(VkllmError, match="model does not fit"):
                Engine.load(two_models[1], tight, n_ctx=N_CTX, ctx=ctx, max_batch=PREFILL_CHUNK)
        finally:
            first.close()
    finally:
        ctx.close()


def test_each_model_keeps_room_for_the_next_and_both_get_a_pool(two_models, tight, vk_settings):
    resident = load_resident(two_models, tight, N_CTX)
    try:
        first, second = resident.engines
        assert [e.name for e in resident.engines] == ["first", "second"]
        (ctx,) = resident.contexts
        assert first.ctx is second.ctx is ctx
        plans = [first.plans[0], second.plans[0]]
        # together within the budget: what the device holds is what the two plans say
        assert ctx.device_pool.used <= BUDGET
        assert sum(p.total for p in plans) <= BUDGET
        # each pool holds more than one context; the first took its half of the room, not all of it
        for plan in plans:
            assert plan.kv_tokens > N_CTX and plan.sequences > 1
        assert 0.5 < plans[0].kv_tokens / plans[1].kv_tokens < 2
        # both serve from the shared context what the model gives in a context of its own
        # (the two files hold the same weights)
        alone = Engine.load(two_models[0], vk_settings, n_ctx=N_CTX)
        try:
            expected = greedy(alone)
        finally:
            alone.close()
        assert [greedy(engine) for engine in resident.engines] == [expected, expected]
    finally:
        resident.close()


def greedy(engine) -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    return [e.token_id for e in engine.generate("Hello there", params) if e.token_id is not None]


def test_a_broken_file_or_a_model_that_cannot_fit_fails_the_load_naming_why(two_models, tight, tmp_path, chunk):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 20)
    with pytest.raises(VkllmError, match="broken.gguf"):   # every file is read before anything loads
        load_resident([two_models[0], broken], tight, N_CTX)
    # a quarter of the budget holds one model's context but not two: the first, keeping room for
    # the second, is refused
    quarter = replace(tight, gpu_memory_utilization=tight.gpu_memory_utilization / 4)
    assert BUDGET / 4 > one_context_bytes(two_models[0], chunk)
    with pytest.raises(VkllmError, match=r"first.gguf: model does not fit: .* is kept for the models loaded "
                                         r"after it: second.gguf"):
        load_resident(two_models, quarter, N_CTX)


@pytest.mark.parametrize("value, expected", [("1", 1.0), ("0.85", 0.85)])
def test_utilization_from_the_environment(value, expected):
    assert Settings.from_env({"VKLLM_GPU_MEMORY_UTILIZATION": value}).gpu_memory_utilization == expected
    assert Settings.from_env({}).gpu_memory_utilization == 1.0


@pytest.mark.parametrize("value", ["0", "1.5", "most", "-0.2"])
def test_bad_utilization_is_refused(value):
    with pytest.raises(VkllmError, match="VKLLM_GPU_MEMORY_UTILIZATION must be a share of the device's memory"):
        Settings.from_env({"VKLLM_GPU_MEMORY_UTILIZATION": value})


def test_one_worker_serves_two_models_at_once(start_worker, client, vk_session, tmp_path, redis_url):
    """`vkllm worker -m A -m B`: jobs for both, submitted together, run in the same steps on the
    context the models share, and each streams what its model gives alone."""
    from tests.conftest import API_KEY
    from tests.test_api import sse_events
    from worker.tools.synth import write_model
    auth = {"Authorization": f"Bearer {API_KEY}"}
    prompt = "The weather is nice, so we will go for a walk"
    paths = [write_model("tiny-llama", tmp_path / "llama-a.gguf"),
             write_model("tiny-qwen2", tmp_path / "qwen-b.gguf", "Q4_0")]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    expected = {}
    for path in paths:
        engine = Engine.load(path, ctx=vk_session, max_batch=64)
        try:
            expected[path.stem] = "".join(e.text for e in engine.generate(prompt, params))
        finally:
            engine.close()
    start_worker("two-models", model=paths[0], args=("-m", str(paths[1])))
    jobs = {}
    for model in expected:
        r = client.post("/api/v1/jobs", json={"model": model, "prompt": prompt, "max_tokens": 16,
                                              "temperature": 0, "ignore_eos": True}, headers=auth)
        assert r.status_code == 202, r.json
        jobs[model] = r.json["id"]
    for model, job_id in jobs.items():
        events = sse_events(client.get(f"/api/v1/jobs/{job_id}/stream", headers=auth).get_data(as_text=True))
        assert events[-1][1] == "end"
        assert "".join(d["text"] for _, kind, d in events if kind == "token") == expected[model]
    assert all(expected.values()) and len(set(expected.values())) == 2
    # at once: each job started before the other ended (the stream's end comes before the job's
    # RQ bookkeeping, so its end time may take a moment)
    import time

    from redis import Redis
    from rq.job import Job
    deadline = time.monotonic() + 30
    while True:
        first, second = Job.fetch_many(list(jobs.values()), connection=Redis.from_url(redis_url))
        if (first.ended_at and second.ended_at) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert first.started_at < second.ended_at and second.started_at < first.ended_at
