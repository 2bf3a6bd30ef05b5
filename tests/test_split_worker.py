"""A real `vkllm worker --devices 0,0` (two contexts on lavapipe's one device, the tiny model's
two layers one on each) serving jobs through the API: the text is the unsplit engine's, and its
registration, metrics and the admin dashboard show the split per device."""
import json
import re
import urllib.request

import pytest
from redis import Redis

from tests.conftest import API_KEY
from tests.test_api import submit, wait
from tests.test_metrics import samples, value
from vkllm import protocol
from worker.engine.engine import Engine
from worker.engine.sampling import SamplingParams


@pytest.fixture(scope="module")
def worker(start_worker):
    return start_worker("split-w1", args=("--devices", "0,0", "--split", "1,1"))


def test_a_split_worker_serves_the_unsplit_text(client, worker, vk_ctx, tiny_model):
    jobs = [submit(client, prompt=prompt, max_tokens=8)["id"] for prompt in ("Hello", "Once upon a time")]
    finals = [wait(client, job) for job in jobs]
    engine = Engine.load(tiny_model, n_ctx=256, ctx=vk_ctx)
    try:
        expected = ["".join(e.text for e in engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8)))
                    for prompt in ("Hello", "Once upon a time")]
    finally:
        engine.close()
    assert [f["state"] for f in finals] == ["finished"] * 2 and all(expected)
    assert [f["output"] for f in finals] == expected


def test_registration_metrics_and_dashboard_show_each_device(app, worker, redis_url):
    stats = json.loads(worker.registration()["stats"])["tiny-llama"]
    devices = stats["devices"]
    assert [d["layers"] for d in devices] == [[0, 1], [1, 2]]
    assert [d["device"] for d in devices] == [0, 0]   # one physical device, two contexts
    assert stats["vram_used_bytes"] == sum(d["vram_used_bytes"] for d in devices) > 0
    port = worker.registration()["metrics_port"]
    found = samples(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode())
    labels = {"model": "tiny-llama", "worker": "split-w1"}
    for i in ("0", "1"):
        assert 0 < value(found, "vkllm_vram_used_bytes", device=i, **labels) <= value(
            found, "vkllm_vram_total_bytes", device=i, **labels)
    browser = app.test_client()
    token = re.search(r'name="csrf" value="([^"]+)"', browser.get("/admin/login").get_data(as_text=True)).group(1)
    assert browser.post("/admin/login", data={"api_key": API_KEY, "csrf": token}).status_code == 302
    assert Redis.from_url(redis_url).exists(protocol.worker_key("split-w1"))
    row = re.search(r"<td>split-w1</td>.*?</tr>", browser.get("/admin/").get_data(as_text=True), re.S).group(0)
    assert re.search(r"device 0 \(llvmpipe[^)]*\)\), layers 0&ndash;0:", row), row
    assert re.search(r"device 0 \(llvmpipe[^)]*\)\), layers 1&ndash;1:", row), row
