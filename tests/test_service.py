"""The GPU worker as a real process: kill -9 mid-job, bad jobs, a model that cannot load."""
import os
import signal
import subprocess
import sys
import time

from tests.conftest import VKLLM
from tests.test_api import AUTH, submit, wait


def test_killed_worker_fails_its_job_keeps_partial_output_and_a_new_worker_serves_the_rest(
        client, start_worker):
    # the whole context for the long job: on a fast CPU the tiny model writes 200 tokens between
    # two polls, and the job could end before it is frozen
    first = start_worker("kill-w1", n_ctx=2048)
    long_job = submit(client, max_tokens=2000)
    while (client.get(f"/api/v1/jobs/{long_job['id']}", headers=AUTH).json["progress"] or {}).get("tokens", 0) < 3:
        time.sleep(0.01)
    os.kill(first.proc.pid, signal.SIGSTOP)   # frozen: the jobs submitted now stay queued
    rest = [submit(client, max_tokens=3)["id"] for _ in range(2)]
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait()
    partial = client.get(f"/api/v1/jobs/{long_job['id']}", headers=AUTH).json["output"]
    assert partial

    start_worker("kill-w2")
    failed = wait(client, long_job["id"], timeout=120)
    assert failed["state"] == "failed"
    assert "kill-w1" in failed["error"] and "stopped" in failed["error"]
    assert failed["output"] == partial
    body = client.get(f"/api/v1/jobs/{long_job['id']}/stream", headers=AUTH).get_data(as_text=True)
    assert body.rstrip().split("\n\n")[-1].splitlines()[1] == "event: error"
    assert [wait(client, i)["state"] for i in rest] == ["finished", "finished"]


def test_a_bad_job_fails_alone(app, client, start_worker):
    from appliance import queue
    start_worker("bad-w1")
    # queued as the API does when no worker counted its tokens in time: too long for the context
    with app.app_context():
        too_long, _ = queue.submit({"model": "tiny-llama", "prompt": "word " * 300, "params": {"max_tokens": 2}},
                                   priority="normal", metadata={}, kind="rest")
    after = submit(client, max_tokens=2)
    failed = wait(client, too_long)
    assert failed["state"] == "failed" and "context" in failed["error"]
    assert wait(client, after["id"])["state"] == "finished"


def test_worker_refuses_a_corrupt_model(tmp_path, redis_url):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(64))
    run = subprocess.run([sys.executable, "-c", VKLLM, "worker", "-m", str(bad), "--redis-url", redis_url,
                          "--metrics-port", "0"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.startswith("vkllm: error:") and "broken.gguf" in run.stderr
