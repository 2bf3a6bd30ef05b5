"""The terminal side: `vkllm up` runs redis, a worker and the web app and prints the URL and a
generated key; `vkllm submit/jobs/follow` talk to it; Ctrl-C stops all three."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import VKLLM


def vkllm(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-c", VKLLM, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


@pytest.fixture(scope="module")
def appliance(tmp_path_factory, tiny_model):
    data = tmp_path_factory.mktemp("up")
    env = {k: v for k, v in os.environ.items() if k != "VKLLM_API_KEY"} | {
        "VKLLM_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "vkcache-workers")}
    proc = subprocess.Popen([sys.executable, "-c", VKLLM, "up", "--port", "0", "--data-dir", str(data),
                             "--models-dir", str(tiny_model.parent), "-m", tiny_model.name],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=interruptible)
    lines = [proc.stdout.readline() for _ in range(3)]
    url = re.search(r"vkllm is up: (http://\S+)/", lines[0]).group(1)
    key = re.search(r"API key .*: (\S+)$", lines[1]).group(1)
    yield proc, url, key, data
    stop(proc)


def interruptible():
    """In a child about to run `vkllm up`: Ctrl-C (SIGINT) as a terminal delivers it, even where the
    tests run as a background job, which starts with SIGINT ignored (and `up` would inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop(proc: subprocess.Popen) -> None:
    """A `vkllm up` the test left running stops as a service manager stops it (SIGTERM: redis and
    the worker with it), killed only if it does not."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_up_submit_follow_jobs_then_ctrl_c(appliance):
    proc, url, key, data = appliance
    env = os.environ | {"VKLLM_URL": url, "VKLLM_API_KEY": key}
    deadline = time.monotonic() + 300
    while "tiny-llama" not in _models(url, key):
        assert time.monotonic() < deadline, (data / "worker.log").read_text()[-2000:]
        time.sleep(0.5)
    run = vkllm("submit", "-m", "tiny-llama", "-n", "5", "--temperature", "0", "Hello", "--follow", env=env)
    assert run.returncode == 0, run.stderr
    job_id = re.search(r"^(\S+) queued at position \d+", run.stderr, re.M).group(1)
    # what the job runs with: the temperature asked for, llama.cpp's defaults for the rest
    applied = re.search(r"queued at position \d+ \((.*)\)$", run.stderr, re.M).group(1)
    assert dict(pair.split(" ") for pair in applied.split(", ")) == {
        "temperature": "0.0", "top_k": "40", "top_p": "0.95", "min_p": "0.05", "repeat_penalty": "1.0",
        "repeat_last_n": "64", "presence_penalty": "0.0", "frequency_penalty": "0.0", "max_tokens": "5"}
    assert "[length]" in run.stderr
    listed = vkllm("jobs", env=env)
    assert re.search(rf"^{job_id}\s+finished\s+tiny-llama\s+5/5 tokens$", listed.stdout, re.M)
    again = vkllm("follow", job_id, env=env)
    assert again.returncode == 0 and again.stdout == run.stdout and run.stdout
    wrong = vkllm("jobs", env=env | {"VKLLM_API_KEY": "nope"})
    assert wrong.returncode == 2 and "401" in wrong.stderr

    children = _children(proc.pid)
    assert len(children) == 2   # redis-server and the worker
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0
    assert not any(os.path.exists(f"/proc/{pid}") and _state(pid) != "Z" for pid in children)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except OSError:
                continue
    return found


def _models(url, key):
    req = urllib.request.Request(f"{url}/api/v1/models", headers={"Authorization": f"Bearer {key}"})
    return json.dumps(json.load(urllib.request.urlopen(req, timeout=10)))


def test_unusable_urls_are_one_line_and_exit_2(tmp_path):
    """A URL without a scheme, a Redis URL of another scheme, a Redis that is not there: one
    'error:' line naming it, exit 2 (each was a traceback)."""
    import socket
    with socket.socket() as s:   # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        closed = f"redis://127.0.0.1:{s.getsockname()[1]}/0"
    for args, line in (
            (("jobs", "--url", "localhost:8000", "--api-key", "k"),
             "vkllm: error: --url must be an http:// or https:// address, not 'localhost:8000'"),
            (("apikey", "rotate", "--redis-url", "localhost:6379"),
             "vkllm apikey: error: argument --redis-url: not a redis://, rediss:// or unix:// URL: 'localhost:6379'"),
            (("worker", "-m", "x.gguf", "--redis-url", "localhost:6379"),
             "vkllm worker: error: argument --redis-url: not a redis://, rediss:// or unix:// URL: 'localhost:6379'"),
            (("apikey", "rotate", "--redis-url", closed), f"vkllm: error: cannot reach Redis at {closed}: ")):
        done = vkllm(*args, timeout=60)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.splitlines()[-1].startswith(line), done.stderr


def test_ports_and_intervals_out_of_range_are_usage_errors(tmp_path):
    """up --port 99999 served on port 34463 (99999 - 65536: the socket layer wraps it), worker
    --metrics-port 99999 ended in an OverflowError traceback once its models had loaded, and
    --heartbeat-interval 0 (or below) made the heartbeat thread spin without pause: each is refused
    by the parser, exit 2, its flag named, before anything starts."""
    for args, line in (
            (("up", "--port", "99999", "--data-dir", str(tmp_path), "-m", "x.gguf"),
             "vkllm up: error: argument --port: not a TCP port (0 to 65535): '99999'"),
            (("up", "--port", "-1", "--data-dir", str(tmp_path), "-m", "x.gguf"),
             "vkllm up: error: argument --port: not a TCP port (0 to 65535): '-1'"),
            (("worker", "-m", "x.gguf", "--metrics-port", "99999"),
             "vkllm worker: error: argument --metrics-port: not a TCP port (0 to 65535): '99999'"),
            (("worker", "-m", "x.gguf", "--heartbeat-interval", "0"),
             "vkllm worker: error: argument --heartbeat-interval: not a number of seconds above 0: '0'"),
            (("worker", "-m", "x.gguf", "--heartbeat-interval", "-5"),
             "vkllm worker: error: argument --heartbeat-interval: not a number of seconds above 0: '-5'"),
            (("worker", "-m", "x.gguf", "--heartbeat-interval", "nan"),
             "vkllm worker: error: argument --heartbeat-interval: not a number of seconds above 0: 'nan'")):
        done = vkllm(*args, timeout=60)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.splitlines()[-1] == line, done.stderr
    assert not (tmp_path / "redis").exists()   # refused before redis-server started


def test_up_on_a_port_in_use_is_one_error_line_and_its_first_key_is_shown_on_the_next_run(tmp_path, tiny_model):
    """A first `vkllm up` whose port is taken stopped with werkzeug's two lines and exit 1, after it had
    generated and stored the API key without showing it: the next run said 'the one printed on the
    first run', which none was, and only `apikey rotate` gave a usable key. Now the port is bound
    before anything starts: one error line, exit 2, no Redis started, and the next run generates and
    shows the key."""
    import socket
    env = {k: v for k, v in os.environ.items() if k != "VKLLM_API_KEY"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = vkllm("up", "--port", str(port), "--data-dir", str(tmp_path), "--models-dir", str(tiny_model.parent),
                     "-m", tiny_model.name, env=env, timeout=60)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert done.stderr.splitlines() == [f"vkllm: error: cannot listen on 127.0.0.1:{port}: Address already in use"]
    assert not (tmp_path / "redis").exists()
    proc = subprocess.Popen([sys.executable, "-c", VKLLM, "up", "--port", "0", "--data-dir", str(tmp_path),
                             "--models-dir", str(tiny_model.parent), "-m", tiny_model.name],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                            preexec_fn=interruptible)
    try:
        lines = [proc.stdout.readline() for _ in range(2)]
        url = re.search(r"vkllm is up: (http://\S+)/", lines[0]).group(1)
        key = re.fullmatch(r"API key \(shown only now; .*\): (\S+)\n", lines[1]).group(1)
        assert "\"object\": \"list\"" in _models(url, key)   # the key shown is the one in force
    finally:
        stop(proc)


def test_follow_sends_the_job_id_as_one_path_segment(live_url):
    """`vkllm follow` put the id into the URL as typed: 'a b' ended in an InvalidURL traceback,
    'x?y' read job 'x' and '../models' the model list's URL. Each is now the id it is."""
    from tests.conftest import API_KEY
    for job_id, line in (("a b", "vkllm: error: 404: no job 'a b' (never submitted, or expired)"),
                         ("x?y", "vkllm: error: 404: no job 'x?y' (never submitted, or expired)"),
                         ("x#y", "vkllm: error: 404: no job 'x#y' (never submitted, or expired)")):
        done = vkllm("follow", job_id, "--url", live_url, "--api-key", API_KEY, timeout=60)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.splitlines() == [line]
    done = vkllm("follow", "../models", "--url", live_url, "--api-key", API_KEY, timeout=60)
    assert done.returncode == 2 and done.stdout == "" and done.stderr.startswith("vkllm: error: 404: "), done.stderr


def test_up_on_an_ipv6_address_prints_a_url_that_works(tmp_path, tiny_model):
    """`vkllm up --host ::1` printed http://::1:PORT/, which no browser or client can open: an
    IPv6 address goes in brackets."""
    proc = subprocess.Popen([sys.executable, "-c", VKLLM, "up", "--host", "::1", "--port", "0", "--data-dir",
                             str(tmp_path), "--models-dir", str(tiny_model.parent), "-m", tiny_model.name],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=interruptible)
    try:
        url = re.fullmatch(r"vkllm is up: (http://\[::1\]:\d+)/  \(admin UI at /admin/\)\n",
                           proc.stdout.readline()).group(1)
        with urllib.request.urlopen(f"{url}/healthz", timeout=10) as r:
            assert json.load(r) == {"status": "ok"}
    finally:
        stop(proc)
