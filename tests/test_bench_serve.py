"""`vkllm bench serve` through the real API (the app served over HTTP, a real worker): every job
is counted, and the tokens it reports are those the worker says it generated."""
import contextlib
import io
import re
import urllib.request

import pytest
from tests.conftest import API_KEY
from tests.test_metrics import samples, value
from vkllm.cli import main


def generated(worker) -> float:
    port = worker.registration()["metrics_port"]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return value(samples(text), "vkllm_tokens_generated_total", model="tiny-llama", worker=worker.name)


def test_bench_serve_through_the_api(live_url, start_worker):
    worker = start_worker("bench-w1")
    before = generated(worker)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", "serve", "--url", live_url, "--api-key", API_KEY, "--model", "tiny-llama",
                     "-n", "4", "-p", "8", "--prefix-tokens", "4", "-o", "5"]) == 0
    text = out.getvalue()
    figures = dict(re.findall(r"^(.+?):\s+(\S+(?: / \S+)?)$", text, re.M))
    assert figures["Successful jobs"] == "4 / 4"
    total = int(figures["Total generated tokens"])
    # and the prefix-reuse pair's one token each, the pair run twice (a warm-up, then timed)
    assert total + 4 == generated(worker) - before and 4 <= total <= 20
    duration = float(figures["Benchmark duration (s)"])
    assert abs(float(figures["Output token throughput (tok/s)"]) - total / duration) < 0.01 * total / duration + 0.01
    ttft = [float(figures[f"{q} TTFT (ms)"]) for q in ("P50", "P90", "P99")]
    assert 0 < ttft[0] <= ttft[1] <= ttft[2] <= duration * 1e3
    assert float(figures["Mean TPOT (ms)"]) > 0
    pair = re.search(r"^Prefix reuse \(4 tokens\): TTFT (\S+) ms alone, (\S+) ms for the next job sharing it: (\S+)x$",
                     text, re.M)
    assert pair and float(pair[3]) == pytest.approx(float(pair[2]) / float(pair[1]), abs=0.01)


def test_bench_serve_straight_into_the_engines_batch(tiny_model, tmp_path_factory, monkeypatch):
    monkeypatch.setenv("VKLLM_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "vkcache-workers"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", "serve", "--engine", str(tiny_model), "-n", "3", "-p", "8", "--prefix-tokens", "40",
                     "-o", "4"]) == 0
    figures = dict(re.findall(r"^(.+?):\s+(\S+(?: / \S+)?)$", out.getvalue(), re.M))
    assert figures["Successful jobs"] == "3 / 3" and figures["Total prompt tokens"] == "144"
    assert 3 <= int(figures["Total generated tokens"]) <= 12
    # the pair: a new 40-token prefix, nothing cached, then its two full 16-token KV blocks reused
    assert re.search(r"^Prefix reuse \(40 tokens\): TTFT \S+ ms alone \(0 of 48 prompt tokens cached\), \S+ ms "
                     r"for the next job sharing it \(32 of 48 prompt tokens cached\): \S+x$", out.getvalue(), re.M)
