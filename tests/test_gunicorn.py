"""The API under gunicorn, as docker-compose runs it, keeps answering its healthcheck while 64
clients hold connections open without a word and 64 more stall halfway through a request head
(real sockets against a real gunicorn); kept-alive connections and request bodies still work."""
import http.client
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import _free_port

KEY = "gunicorn-slow-clients-key"


@pytest.fixture(scope="module")
def gunicorn_port(redis_url, tmp_path_factory):
    port = _free_port()
    env = os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path_factory.mktemp("prom")), "VKLLM_REDIS_URL": redis_url,
                        "VKLLM_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "--config", "python:appliance.gunicorn_conf",
                             "--bind", f"127.0.0.1:{port}", "appliance.app:create_app()"], env=env,
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    yield port
    proc.terminate()
    proc.wait(30)


def get(port, path, conn=None, **kw):
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request(kw.pop("method", "GET"), path, **kw)
    r = conn.getresponse()
    return r.status, r.read()


def test_healthcheck_answers_through_idle_and_stalled_connections(gunicorn_port):
    held = []
    try:
        for i in range(128):
            s = socket.create_connection(("127.0.0.1", gunicorn_port))
            if i % 2:   # half of them stall in the middle of their request head
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agent: slow")
            held.append(s)
        time.sleep(1)   # every one of them accepted and waiting
        for _ in range(5):   # the compose healthcheck's timeout is 5 s
            assert get(gunicorn_port, "/healthz") == (200, b'{"status":"ok"}\n')
        auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        kept = http.client.HTTPConnection("127.0.0.1", gunicorn_port, timeout=5)
        for _ in range(3):   # one kept-alive connection, several requests, one with a body
            status, body = get(gunicorn_port, "/api/v1/tokenize", kept, method="POST", headers=auth,
                               body=json.dumps({"model": "nobody", "prompt": "x"}))
            assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
            assert get(gunicorn_port, "/api/v1/models", kept, headers=auth)[0] == 200
        # the stalled ones finish their request and are answered
        for s in held[1::2]:
            s.sendall(b"\r\nConnection: close\r\n\r\n")
        for s in held[1:8:2]:
            s.settimeout(5)
            assert s.recv(100).startswith(b"HTTP/1.1 200")
    finally:
        for s in held:
            s.close()
