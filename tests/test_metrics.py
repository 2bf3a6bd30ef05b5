"""/metrics of a worker and of the web app after real jobs; the Grafana dashboard asks only for
series that exist."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.test_api import AUTH, submit, wait

DASHBOARD = Path(__file__).parent.parent / "monitoring" / "grafana" / "dashboards" / "vkllm.json"


def samples(text: str) -> dict:
    """(name, sorted labels) -> value for every sample of a Prometheus text exposition."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture(scope="module")
def scraped(client_module, start_worker):
    worker = start_worker("metrics-w1")
    jobs = [submit(client_module, max_tokens=4)["id"] for _ in range(2)]
    finals = [wait(client_module, j) for j in jobs]
    port = worker.registration()["metrics_port"]
    worker_text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    api_text = client_module.get("/metrics").get_data(as_text=True)
    return samples(worker_text), samples(api_text), finals


@pytest.fixture(scope="module")
def client_module(app):
    return app.test_client()


def value(found: dict, name: str, **labels) -> float:
    return found[(name, tuple(sorted(labels.items())))]


def test_worker_series(scraped):
    worker, _, finals = scraped
    labels = {"model": "tiny-llama", "worker": "metrics-w1"}
    generated = sum(f["usage"]["completion_tokens"] for f in finals)
    assert value(worker, "vkllm_tokens_generated_total", **labels) == generated
    assert value(worker, "vkllm_prompt_tokens_total", **labels) == sum(f["usage"]["prompt_tokens"] for f in finals)
    assert value(worker, "vkllm_generation_tokens_per_second", **labels) > 0
    assert value(worker, "vkllm_time_to_first_token_seconds_count", **labels) == 2
    assert value(worker, "vkllm_time_per_output_token_seconds_count", **labels) == 2
    assert value(worker, "vkllm_job_duration_seconds_count", **labels) == 2
    assert value(worker, "vkllm_job_duration_seconds_bucket", le="28800.0", **labels) == 2
    assert 0 < value(worker, "vkllm_vram_used_bytes", device="0", **labels) <= value(
        worker, "vkllm_vram_total_bytes", device="0", **labels)
    assert ("vkllm_vram_used_bytes", tuple(sorted({**labels, "device": "1"}.items()))) not in worker   # unsplit
    assert 0 <= value(worker, "vkllm_kv_cache_usage_ratio", **labels) <= 1
    assert value(worker, "vkllm_model_loaded", **labels) == 1
    # the continuous batch, empty again; its KV blocks (cached prefixes may keep some in use)
    assert value(worker, "vkllm_num_requests_running", **labels) == 0
    assert value(worker, "vkllm_kv_cache_free_blocks", **labels) > 0 <= value(worker, "vkllm_kv_cache_used_blocks",
                                                                              **labels)
    assert value(worker, "vkllm_prefix_cache_hit_tokens_total", **labels) >= 0


def test_api_series(scraped):
    _, api, _ = scraped
    assert value(api, "vkllm_queue_depth", model="tiny-llama") == 0
    assert value(api, "vkllm_jobs", state="finished") >= 2
    assert value(api, "vkllm_workers") >= 1
    assert value(api, "vkllm_http_requests_total", route="/api/v1/jobs", method="POST", status="202") >= 2
    assert value(api, "vkllm_http_request_duration_seconds_count", route="/api/v1/jobs/<job_id>", method="GET") >= 2


def test_dashboard_asks_only_for_existing_series(scraped):
    worker, api, _ = scraped
    exposed = {name for name, _ in worker} | {name for name, _ in api}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    used = {m for e in exprs for m in re.findall(r"\bvkllm_[a-z_]+\b", e)}
    assert used and used <= exposed, used - exposed
    # a legend names labels its series carry; a target of a bare series names all of them, so that
    # no two series (two models on one worker, say) share a legend
    labels = {}
    for name, pairs in list(worker) + list(api):
        labels.setdefault(name, set()).update(k for k, _ in pairs)
    for target in (t for p in dashboard["panels"] for t in p.get("targets", [])):
        named = set(re.findall(r"{{(\w+)}}", target.get("legendFormat", "")))
        carried = set().union(*(labels[m] for m in re.findall(r"\bvkllm_[a-z_]+\b", target["expr"])))
        assert named <= carried, (target["expr"], named - carried)
        if target["expr"] in labels:
            assert named == labels[target["expr"]], (target["expr"], labels[target["expr"]] - named)
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("tokens/s", "time to first token", "time per output token", "vram", "kv cache", "queue depth",
                  "jobs by state"):
        assert topic in titles


def test_metrics_need_no_key_but_api_does(client_module):
    assert client_module.get("/metrics").status_code == 200
    assert client_module.get("/api/v1/models").status_code == 401
    assert client_module.get("/api/v1/models", headers=AUTH).status_code == 200


def test_gunicorn_processes_share_one_metrics_view(redis_url, tmp_path):
    """Two gunicorn processes: /metrics, whichever answers, counts the requests both served."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom"), "VKLLM_REDIS_URL": redis_url,
                        "VKLLM_API_KEY": "gunicorn-key", "VKLLM_WEB_PROCESSES": "2"}
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "--config", "python:appliance.gunicorn_conf",
                             "--bind", f"127.0.0.1:{port}", "appliance.app:create_app()"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                urllib.request.urlopen(f"{base}/healthz", timeout=2)
                break
            except OSError:
                time.sleep(0.1)
        for _ in range(19):
            urllib.request.urlopen(f"{base}/healthz", timeout=10)
        found = samples(urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode())
        assert value(found, "vkllm_http_requests_total", route="/healthz", method="GET", status="200") == 20
        assert any(name.endswith(".db") for name in os.listdir(tmp_path / "prom"))
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_served_model_has_its_queue_depth_before_any_job(tmp_path, tiny_model, tmp_path_factory):
    """A fresh appliance: the dashboard's queue panel (and the admin dashboard, from the same
    queue.queue_depths) shows the model a worker serves at 0 waiting, not nothing until its
    first job (RQ lists a queue only from then)."""
    from appliance.app import create_app
    from tests.conftest import API_KEY, private_redis, worker_starter
    with private_redis(tmp_path) as url, worker_starter(url, tiny_model, tmp_path_factory, tmp_path) as start:
        start("fresh-w1")
        app = create_app({"REDIS_URL": url, "API_KEY": API_KEY, "SECRET_KEY": "s", "TESTING": True,
                          "MODELS_DIR": str(tiny_model.parent)})
        scraped = samples(app.test_client().get("/metrics").get_data(as_text=True))
        assert value(scraped, "vkllm_queue_depth", model="tiny-llama") == 0


def test_a_job_cancelled_during_prefill_counts_no_prompt_tokens_and_no_first_token(tmp_path, tiny_model,
                                                                                   tmp_path_factory, vk_ctx):
    """As vLLM counts them: a job's prompt tokens once its prefill is done (its first token
    out), its time to first token only when there is one. A job cancelled in the middle of its
    prompt counted its whole prompt in vkllm_prompt_tokens_total, and reported a time to first
    token (the time until it was cancelled) although no token came out."""
    from redis import Redis

    from appliance.app import create_app
    from tests.conftest import API_KEY, private_redis, worker_starter
    from vkllm import protocol
    from worker.engine.engine import CPU_PREFILL_CHUNK
    if vk_ctx.info.kind != "cpu":   # a GPU's chunk (512 or more) takes the worker's whole context at once
        pytest.skip("a cancel between prefill chunks needs a CPU driver's CPU_PREFILL_CHUNK")
    with private_redis(tmp_path) as url, worker_starter(url, tiny_model, tmp_path_factory, tmp_path) as start:
        worker = start("prefill-w1")
        client = create_app({"REDIS_URL": url, "API_KEY": API_KEY, "SECRET_KEY": "s", "TESTING": True,
                             "MODELS_DIR": str(tiny_model.parent)}).test_client()
        port = worker.registration()["metrics_port"]

        def scrape():
            found = samples(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode())
            return {name: value(found, f"vkllm_{name}", model="tiny-llama", worker="prefill-w1") for name in (
                "prompt_tokens_total", "tokens_generated_total", "time_to_first_token_seconds_count",
                "time_to_first_token_seconds_sum", "job_duration_seconds_count")}

        # cancelled as the worker takes it (the cancel key the API sets for a running job, or for a
        # queued one the worker takes meanwhile): its first prefill chunk runs, then it ends
        os.kill(worker.proc.pid, signal.SIGSTOP)
        try:
            cancelled = submit(client, prompt="Hello there, " * 30, max_tokens=4)["id"]
            Redis.from_url(url).set(protocol.cancel_key(cancelled), 1)
        finally:
            os.kill(worker.proc.pid, signal.SIGCONT)
        job = wait(client, cancelled)
        assert (job["state"], job["finish_reason"], job["output"]) == ("cancelled", "cancelled", "")
        assert job["usage"]["completion_tokens"] == 0 and job["usage"]["prompt_tokens"] > CPU_PREFILL_CHUNK
        assert job["timings"] == {"time_to_first_token": None, "prompt_tokens_per_second": None,
                                  "generation_tokens_per_second": 0.0}
        assert scrape() == {"prompt_tokens_total": 0, "tokens_generated_total": 0,
                            "time_to_first_token_seconds_count": 0, "time_to_first_token_seconds_sum": 0,
                            "job_duration_seconds_count": 1}

        done = wait(client, submit(client, max_tokens=2)["id"])
        assert done["state"] == "finished" and done["usage"]["completion_tokens"] == 2
        after = scrape()
        assert after == {"prompt_tokens_total": done["usage"]["prompt_tokens"], "tokens_generated_total": 2,
                         "time_to_first_token_seconds_count": 1,
                         "time_to_first_token_seconds_sum": after["time_to_first_token_seconds_sum"],
                         "job_duration_seconds_count": 2}
        assert after["time_to_first_token_seconds_sum"] == pytest.approx(done["timings"]["time_to_first_token"],
                                                                           abs=1e-9)


def test_a_job_whose_step_fails_after_its_prefill_counts_its_prompt_tokens(tmp_path, tiny_model, tmp_path_factory):
    """A job failed by a batch step after its prefill (its first tokens out) counted no prompt
    tokens and no time to first token: that failure path kept the job's empty timings. The job
    fails for real here, after its first tokens: a JSON boolean's grammar ends at "true", before
    min_tokens (its step fails it alone since, MinTokensUnmet, with the timings it has)."""
    from appliance.app import create_app
    from tests.conftest import API_KEY, private_redis, worker_starter
    with private_redis(tmp_path) as url, worker_starter(url, tiny_model, tmp_path_factory, tmp_path) as start:
        worker = start("stepfail-w1")
        client = create_app({"REDIS_URL": url, "API_KEY": API_KEY, "SECRET_KEY": "s", "TESTING": True,
                             "MODELS_DIR": str(tiny_model.parent)}).test_client()
        port = worker.registration()["metrics_port"]
        schema = {"type": "json_schema", "json_schema": {"name": "flag", "schema": {"type": "boolean"}}}
        job = wait(client, submit(client, prompt="Is it?", max_tokens=20, min_tokens=10, response_format=schema)["id"])
        assert (job["state"], job["output"]) == ("failed", "true")
        assert job["error"] == ("min_tokens=10 cannot be met: the output's grammar (response_format or "
                                "tool_choice) is complete after 4 tokens")
        prompt = client.post("/api/v1/tokenize", json={"model": "tiny-llama", "prompt": "Is it?"},
                             headers=AUTH).json["tokens"]
        found = samples(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode())
        assert {name: value(found, f"vkllm_{name}", model="tiny-llama", worker="stepfail-w1") for name in (
            "prompt_tokens_total", "tokens_generated_total", "time_to_first_token_seconds_count",
            "job_duration_seconds_count")} == {"prompt_tokens_total": prompt,
                                               "tokens_generated_total": job["progress"]["tokens"],
                                               "time_to_first_token_seconds_count": 1,
                                               "job_duration_seconds_count": 1}
