"""The overrides file beside a GGUF (vkllm/overrides.py) and the demo model it serves:
SmolLM2-135M-Instruct as Ollama serves it (the model card's sampling, no default system turn),
which answers a first question at its default parameters."""
import concurrent.futures
import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import VKLLM, openai_client
from tests.test_api import AUTH, wait
from vkllm.demo import MODEL_NAME, OVERRIDES, OVERRIDES_NAME, fetch_demo
from vkllm.overrides import path_for
from worker.engine.errors import GGUFError
from worker.engine.modelfile import ModelFile
from worker.engine.sampling import model_defaults

# llama.cpp server's defaults, written out (tests/test_sampling_defaults.py checks them)
LLAMA_CPP = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0,
             "repeat_last_n": 64, "presence_penalty": 0.0, "frequency_penalty": 0.0}
TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] "
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def overridden(tmp_path):
    """A tiny model carrying general.sampling.temp 0.3 in its GGUF, with an overrides file."""
    from worker.tools.synth import write_model
    path = write_model("tiny-llama", tmp_path / "tiny.gguf", extra={"general.sampling.temp": 0.3,
                                                                     "general.sampling.top_k": 7})
    path_for(path).write_text(json.dumps({"general.sampling.temp": 0.25, "general.sampling.min_p": 0.2,
                                          "tokenizer.chat_template": TEMPLATE}))
    return path


def test_overrides_replace_the_files_values(overridden):
    model = ModelFile.open(overridden)
    assert model.overridden == ("general.sampling.temp", "general.sampling.min_p", "tokenizer.chat_template")
    # the override wins over the GGUF's own value; what it leaves alone stays the GGUF's
    assert model_defaults(model.metadata, 256) == LLAMA_CPP | {"temperature": 0.25, "top_k": 7, "min_p": 0.2}
    assert model.metadata["tokenizer.chat_template"] == TEMPLATE


def test_the_engine_renders_chats_with_the_overridden_template(overridden, vk_session):
    from worker.engine.engine import Engine
    engine = Engine.load(overridden, ctx=vk_session, n_ctx=64, max_batch=16)
    try:
        assert engine.render_chat([{"role": "user", "content": "hi"}]) == "[user] hi\n[assistant] "
        assert engine.sampling_defaults["temperature"] == 0.25
    finally:
        engine.close()


def test_inspect_names_the_overrides(overridden):
    done = subprocess.run([sys.executable, "-c", VKLLM, "models", "inspect", str(overridden)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"overrides       {path_for(overridden)}: general.sampling.temp, general.sampling.min_p, " \
           "tokenizer.chat_template" in done.stdout
    assert "temperature 0.25 (override), top_k 7 (GGUF), top_p 0.95, min_p 0.2 (override)" in done.stdout


@pytest.mark.parametrize("text,message", [
    ("{", "is not valid JSON"),
    ("[1]", "must hold a JSON object of GGUF keys and values"),
    ('{"llama.block_count": 2}', "'llama.block_count' cannot be overridden (allowed: general.sampling.min_p"),
    ('{"general.sampling.temp": "hot"}', 'general.sampling.temp must be a number, not "hot"'),
    ('{"general.sampling.top_k": 4.5}', "general.sampling.top_k must be an integer, not 4.5"),
    ('{"general.sampling.top_k": true}', "general.sampling.top_k must be an integer, not true"),
    ('{"tokenizer.chat_template": 3}', "tokenizer.chat_template must be a string, not 3"),
])
def test_a_bad_overrides_file_is_refused_naming_it(overridden, text, message):
    path_for(overridden).write_text(text)
    with pytest.raises(GGUFError, match=str(path_for(overridden)).replace(".", r"\.")) as refused:
        ModelFile.open(overridden)
    assert message in str(refused.value)


def test_fetch_demo_writes_the_overrides_once(tmp_path, smollm2_path):
    """The GGUF already there is kept; the overrides are written beside it, and a user's edit of
    them stays."""
    (tmp_path / MODEL_NAME).symlink_to(smollm2_path)
    assert fetch_demo(tmp_path) == tmp_path / MODEL_NAME
    written = tmp_path / OVERRIDES_NAME
    assert written == path_for(tmp_path / MODEL_NAME) and json.loads(written.read_text()) == OVERRIDES
    written.write_text('{"general.sampling.temp": 0.5}')
    fetch_demo(tmp_path)
    assert json.loads(written.read_text()) == {"general.sampling.temp": 0.5}


@pytest.fixture(scope="module")
def demo(tmp_path_factory, smollm2_path):
    """The demo as `vkllm models fetch-demo` installs it (the downloaded GGUF reused)."""
    folder = tmp_path_factory.mktemp("demo")
    shutil.copy(smollm2_path, folder / MODEL_NAME)
    return fetch_demo(folder)


def test_the_demo_answers_at_its_default_parameters(demo, start_worker, live_url, client):
    """What a new user tries first: no sampling parameter, ten seeds, ten answers naming Paris;
    the defaults applied are the model card's, recorded with the job."""
    start_worker("demo-w1", model=demo)
    oai = openai_client(live_url, 600)
    name = demo.stem
    listed = {m.id: m.model_extra for m in oai.models.list().data}
    assert listed[name]["sampling_defaults"] == LLAMA_CPP | {"temperature": 0.2, "top_p": 0.9}

    def ask(seed):
        return oai.chat.completions.create(model=name, messages=FRANCE, max_tokens=24, seed=seed)
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        answers = [a.choices[0].message.content for a in pool.map(ask, range(10))]
    assert all("Paris" in a for a in answers), answers

    r = client.post("/api/v1/jobs", json={"model": name, "messages": FRANCE, "max_tokens": 24, "seed": 3},
                    headers=AUTH)
    assert r.status_code == 202, r.json
    job = wait(client, r.json["id"])
    assert job["params"] == LLAMA_CPP | {"temperature": 0.2, "top_p": 0.9, "seed": 3, "max_tokens": 24}
    assert job["output"] == answers[3]
