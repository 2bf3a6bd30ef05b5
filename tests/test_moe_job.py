"""A tiny qwen3moe file through the whole job path: REST job, Redis queue, a real `vkllm worker`
process on lavapipe, the token stream; the text equals this process's engine on the same file."""
import pytest

from tests.conftest import API_KEY
from tests.test_api import sse_events
from worker.engine.engine import Engine
from worker.engine.sampling import SamplingParams
from worker.tools.synth import write_model

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "The weather is nice, so we will go for a walk in the park."


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    return write_model("tiny-qwen3moe", tmp_path_factory.mktemp("moe") / "tiny-qwen3moe.gguf", "Q4_K_M")


def test_rest_job_on_a_worker_matches_the_engine(start_worker, moe_model, client, vk_session):
    engine = Engine.load(moe_model, ctx=vk_session, max_batch=64)
    try:
        assert engine.model.config.n_expert == 8
        expected = "".join(e.text for e in engine.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=10)))
    finally:
        engine.close()
    start_worker("moe-w1", model=moe_model)
    r = client.post("/api/v1/jobs", json={"model": "tiny-qwen3moe", "prompt": PROMPT, "max_tokens": 10,
                                          "temperature": 0}, headers=AUTH)
    assert r.status_code == 202, r.json
    events = sse_events(client.get(f"/api/v1/jobs/{r.json['id']}/stream", headers=AUTH).get_data(as_text=True))
    assert events[-1][1] == "end"
    assert "".join(d["text"] for _, kind, d in events if kind == "token") == expected
    assert expected
