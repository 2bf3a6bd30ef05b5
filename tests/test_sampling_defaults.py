"""Sampling parameters a request leaves unset: llama.cpp server's defaults, or the model's own
general.sampling.* values. Checked against llama.cpp's documented defaults (written out here, not
read from the code), through the jobs' recorded parameters, and on seeded runs, which must give the
same tokens as a request that spells the same values out."""
import subprocess
import sys

import pytest

from tests.conftest import VKLLM, openai_client
from tests.test_api import AUTH, wait

# llama.cpp's server README (tools/server): temperature 0.8, top_k 40, top_p 0.95, min_p 0.05,
# repeat_penalty 1.0, repeat_last_n 64, presence and frequency penalties 0.
LLAMA_CPP = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0,
             "repeat_last_n": 64, "presence_penalty": 0.0, "frequency_penalty": 0.0}
# what the synthetic model below recommends in its GGUF, and under which keys
RECOMMENDED = {"temperature": 0.3, "top_k": 7, "top_p": 0.8, "min_p": 0.1, "repeat_penalty": 1.1,
               "repeat_last_n": 32}
KEYS = {"general.sampling.temp": 0.3, "general.sampling.top_k": 7, "general.sampling.top_p": 0.8,
        "general.sampling.min_p": 0.1, "general.sampling.penalty_repeat": 1.1,
        "general.sampling.penalty_last_n": 32}
OWN = "tiny-llama-sampling"


@pytest.fixture(scope="module")
def own_model(tiny_model):
    """The tiny model with recommended sampling values in its metadata (same folder, other name)."""
    from worker.tools.synth import write_model
    return write_model("tiny-llama", tiny_model.parent / f"{OWN}.gguf", extra=KEYS)


@pytest.fixture(scope="module")
def workers(start_worker, own_model):
    return start_worker("defaults-w1"), start_worker("defaults-w2", model=own_model)


def test_sampling_params_defaults_are_llama_cpps():
    from dataclasses import asdict

    from worker.engine.sampling import SamplingParams
    assert {k: v for k, v in asdict(SamplingParams()).items() if k in LLAMA_CPP} == LLAMA_CPP


def test_model_defaults_read_the_gguf(own_model, tiny_model):
    from worker.engine.modelfile import ModelFile
    from worker.engine.sampling import model_defaults
    assert model_defaults(ModelFile.open(tiny_model).metadata, 256) == LLAMA_CPP
    assert model_defaults(ModelFile.open(own_model).metadata, 256) == LLAMA_CPP | RECOMMENDED


def test_llama_cpp_conventions_and_values_out_of_range(tmp_path):
    """penalty_last_n -1 is the whole context; a value SamplingParams refuses is not taken."""
    from worker.engine.modelfile import ModelFile
    from worker.engine.sampling import model_defaults
    from worker.tools.synth import write_model
    path = write_model("tiny-llama", tmp_path / "odd.gguf", extra={
        "general.sampling.penalty_last_n": -1, "general.sampling.top_p": 0.0, "general.sampling.temp": 0.0})
    got = model_defaults(ModelFile.open(path).metadata, 256)
    assert got == LLAMA_CPP | {"repeat_last_n": 256, "temperature": 0.0}


def _job(client, **body):
    body = ({"max_tokens": 8} if "messages" in body else {"prompt": "Once upon a time", "max_tokens": 8}) | body
    r = client.post("/api/v1/jobs", json=body, headers=AUTH)
    assert r.status_code == 202, r.json
    return r.json, wait(client, r.json["id"])


@pytest.mark.parametrize("model,expected", [("tiny-llama", LLAMA_CPP), (OWN, LLAMA_CPP | RECOMMENDED)])
def test_unset_parameters_are_recorded_and_run_as_the_defaults(client, workers, model, expected):
    queued, job = _job(client, model=model, seed=11)
    assert job["state"] == "finished"
    assert queued["params"] == job["params"] == expected | {"seed": 11, "max_tokens": 8}
    _, spelled_out = _job(client, model=model, seed=11, **expected)
    assert spelled_out["params"] == job["params"]
    assert spelled_out["output"] == job["output"] and job["usage"]["completion_tokens"] == 8
    # the comparison can tell sampling settings apart: the whole vocabulary at temperature 1.5
    _, other = _job(client, model=model, seed=11, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
    assert other["output"] != job["output"]


def test_set_parameters_are_kept_and_temperature_zero_stays_greedy(client, workers):
    _, job = _job(client, model=OWN, temperature=0, top_k=3, seed=5)
    assert job["params"] == LLAMA_CPP | RECOMMENDED | {"temperature": 0, "top_k": 3, "seed": 5, "max_tokens": 8}
    _, other_seed = _job(client, model=OWN, temperature=0, top_k=3, seed=6)
    assert other_seed["output"] == job["output"]


def test_models_listings_show_the_defaults(client, live_url, workers):
    rest = {m["name"]: m["sampling_defaults"] for m in client.get("/api/v1/models", headers=AUTH).json["data"]}
    assert rest["tiny-llama"] == LLAMA_CPP and rest[OWN] == LLAMA_CPP | RECOMMENDED
    oai = openai_client(live_url, 300)
    listed = {m.id: m.model_extra["sampling_defaults"] for m in oai.models.list().data}
    assert listed == rest


def test_openai_endpoints_apply_the_models_defaults(client, live_url, workers):
    """A chat and a completion with no sampling parameter: the same text as the REST job that
    spells the model's defaults out with the same seed."""
    oai = openai_client(live_url, 300)
    chat = oai.chat.completions.create(model=OWN, messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                                       seed=3)
    _, rest = _job(client, model=OWN, messages=[{"role": "user", "content": "Hi"}], seed=3,
                   **(LLAMA_CPP | RECOMMENDED))
    assert chat.choices[0].message.content == rest["output"]
    done = oai.completions.create(model=OWN, prompt="Once upon a time", max_tokens=8, seed=3)
    _, rest = _job(client, model=OWN, seed=3, **(LLAMA_CPP | RECOMMENDED))
    assert done.choices[0].text == rest["output"]
    recorded = client.get("/api/v1/jobs?limit=4", headers=AUTH).json["data"]
    assert [j["params"] for j in recorded[1::2]] == [LLAMA_CPP | RECOMMENDED | {"seed": 3, "max_tokens": 8}] * 2


def test_openapi_documents_the_defaults(client):
    props = client.get("/api/v1/openapi.json", headers=AUTH).json["components"]["schemas"]["JobRequest"][
        "properties"]
    assert "general.sampling.temp" in props["temperature"]["description"]
    for name, value in LLAMA_CPP.items():
        assert f"{value:g} (llama.cpp server's default)" in props[name]["description"]


def _generate(model, *options):
    done = subprocess.run([sys.executable, "-c", VKLLM, "generate", "-m", str(model), "-p", "Once upon a time",
                           "-n", "8", "-c", "256", "--seed", "4", *options], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_generate_cli_applies_the_models_defaults(own_model):
    spelled_out = [f"--{name.replace('_', '-')}={value}" for name, value in (LLAMA_CPP | RECOMMENDED).items()]
    assert _generate(own_model) == _generate(own_model, *spelled_out)
    assert _generate(own_model) != _generate(own_model, "--temperature=1.5", "--top-k=0", "--min-p=0", "--top-p=1")


def test_inspect_shows_the_defaults_and_where_they_come_from(own_model):
    done = subprocess.run([sys.executable, "-c", VKLLM, "models", "inspect", str(own_model)], capture_output=True,
                          text=True)
    line = next(x for x in done.stdout.splitlines() if x.startswith("sampling"))
    assert line.split(None, 1)[1] == ("temperature 0.3 (GGUF), top_k 7 (GGUF), top_p 0.8 (GGUF), min_p 0.1 (GGUF), "
                                      "repeat_penalty 1.1 (GGUF), repeat_last_n 32 (GGUF), presence_penalty 0, "
                                      "frequency_penalty 0")


@pytest.mark.parametrize("option, named", [("--top-p=7", "top_p"), ("--seed=-1", "seed")])
def test_generate_refuses_sampling_values_before_it_opens_the_model(tmp_path, option, named):
    """A sampling value the engine refuses is refused before the model is read (a large model
    takes a while to load): the file here is no GGUF at all, and the error names the value."""
    not_a_model = tmp_path / "model.gguf"
    not_a_model.write_bytes(b"not a gguf")
    done = subprocess.run([sys.executable, "-c", VKLLM, "generate", "-m", str(not_a_model), "-p", "hi", option],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert named in done.stderr.splitlines()[-1], done.stderr
