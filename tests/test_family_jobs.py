"""A tiny file of each newer family through the whole job path: REST job, Redis queue, a real
`vkllm worker` process on lavapipe, the token stream; the text equals this process's engine on
the same file. For gemma3 the prompt (32 tokens) is longer than the model's 8-position sliding
window; the qwen3moe file has 8 experts, the qwen2moe one a shared expert besides."""
import pytest

from tests.conftest import API_KEY
from tests.test_api import sse_events
from worker.engine.engine import Engine
from worker.engine.sampling import SamplingParams
from worker.tools.synth import write_model

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "The weather is nice, so we will go for a walk in the park."
# preset -> what makes the file the case it is meant to be
CASES = {
    "tiny-gemma3": lambda engine: len(engine.tokenizer.encode(PROMPT)) > engine.model.config.sliding_window,
    "tiny-qwen3moe": lambda engine: engine.model.config.n_expert == 8,
    "tiny-qwen2moe": lambda engine: engine.model.config.n_ff_shexp > 0,
}


@pytest.mark.parametrize("preset", CASES)
def test_rest_job_on_a_worker_matches_the_engine(start_worker, client, vk_session, tmp_path, preset):
    path = write_model(preset, tmp_path / f"{preset}.gguf", "Q4_K_M")
    engine = Engine.load(path, ctx=vk_session, max_batch=64)
    try:
        assert CASES[preset](engine)
        expected = "".join(e.text for e in engine.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=10)))
    finally:
        engine.close()
    start_worker(f"{preset}-w1", model=path)
    r = client.post("/api/v1/jobs", json={"model": preset, "prompt": PROMPT, "max_tokens": 10,
                                          "temperature": 0}, headers=AUTH)
    assert r.status_code == 202, r.json
    events = sse_events(client.get(f"/api/v1/jobs/{r.json['id']}/stream", headers=AUTH).get_data(as_text=True))
    assert events[-1][1] == "end"
    assert "".join(d["text"] for _, kind, d in events if kind == "token") == expected
    assert expected
