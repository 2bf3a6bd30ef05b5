"""A tiny gemma3 file through the whole job path: REST job, Redis queue, a real `vkllm worker`
process on lavapipe, the token stream; the text equals this process's engine on the same file.
The prompt (32 tokens) is longer than the model's 8-position sliding window."""
import pytest

from tests.conftest import API_KEY
from tests.test_api import sse_events
from worker.engine.engine import Engine
from worker.engine.sampling import SamplingParams
from worker.tools.synth import write_model

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "The weather is nice, so we will go for a walk in the park."


@pytest.fixture(scope="module")
def gemma3_model(tmp_path_factory):
    return write_model("tiny-gemma3", tmp_path_factory.mktemp("gemma3") / "tiny-gemma3.gguf", "Q4_K_M")


def test_rest_job_on_a_worker_matches_the_engine(start_worker, gemma3_model, client, vk_session):
    engine = Engine.load(gemma3_model, ctx=vk_session, max_batch=64)
    try:
        assert len(engine.tokenizer.encode(PROMPT)) > engine.model.config.sliding_window
        expected = "".join(e.text for e in engine.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=10)))
    finally:
        engine.close()
    start_worker("gemma3-w1", model=gemma3_model)
    r = client.post("/api/v1/jobs", json={"model": "tiny-gemma3", "prompt": PROMPT, "max_tokens": 10,
                                          "temperature": 0}, headers=AUTH)
    assert r.status_code == 202, r.json
    events = sse_events(client.get(f"/api/v1/jobs/{r.json['id']}/stream", headers=AUTH).get_data(as_text=True))
    assert events[-1][1] == "end"
    assert "".join(d["text"] for _, kind, d in events if kind == "token") == expected
    assert expected
