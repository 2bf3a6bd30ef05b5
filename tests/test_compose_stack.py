"""The compose stack for real: the image built from the Dockerfile, redis, api, worker and
prometheus started from docker-compose.yml by Debian's docker-compose on a dockerd this module
starts itself, a job run through the REST API on a tiny synthetic model, and every Grafana
panel's PromQL evaluated against the stack's Prometheus.

No registry is reachable: the base image the Dockerfile names is made with mmdebstrap from this
machine's apt mirror, and the redis and prometheus images are stand-ins built from Debian's
packages under the tags the compose file uses. Grafana has no Debian package, so it does not run
here (its provisioning files are checked in test_compose.py). Everything lives in one temp folder
(dockerd's data and exec roots, socket, pidfile, the compose project) that is removed at the end.
Takes 3 to 9 minutes on 2 cores, most of it building the images."""
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import _free_port
from tests.test_compose import copy_project, env_file

pytestmark = [pytest.mark.compose, pytest.mark.timeout(1800)]

ROOT = Path(__file__).parent.parent
log = logging.getLogger(__name__)     # each phase, with pytest's timestamps (--log-cli-level=INFO)
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
API_KEY = "compose-test-key-0123456789"
SERVICES = ("redis", "api", "worker", "prometheus")
MAX_TOKENS = 8

# Stand-ins for the images compose pulls, from Debian's packages. The compose file replaces redis'
# default configuration on its command line, which turns protected mode on: the official image is
# built with it off, so the stand-in passes `--protected-mode no`.
REDIS_DOCKERFILE = """FROM {base}
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server \\
 && rm -rf /var/lib/apt/lists/* && mkdir /data
WORKDIR /data
ENTRYPOINT ["sh", "-c", "exec \\"$@\\" --protected-mode no", "redis"]
CMD ["redis-server"]
"""
PROMETHEUS_DOCKERFILE = """FROM {base}
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus wget \\
 && rm -rf /var/lib/apt/lists/* && mkdir /prometheus
WORKDIR /prometheus
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml"]
"""


def apt_mirror(suite: str) -> str:
    """The Debian mirror this machine's apt uses for the suite."""
    run = subprocess.run(["apt-get", "indextargets", "--format", "$(REPO_URI) $(CODENAME) $(COMPONENT)",
                          "Identifier: Packages"], capture_output=True, text=True)
    for line in run.stdout.splitlines():
        uri, codename, component = line.split()
        if codename == suite and component == "main":
            return uri
    return "http://deb.debian.org/debian"


class Engine:
    """Debian's dockerd with every piece of its state under `folder`. No default bridge and no
    iptables rules: the stack runs on its own compose network and reaches the host through the
    userland proxy of its published ports, and image builds use the host's network."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.env = {"PATH": os.environ["PATH"], "HOME": str(folder),
                    "DOCKER_HOST": f"unix://{folder}/docker.sock", "DOCKER_BUILDKIT": "0"}
        self.log = open(folder / "dockerd.log", "w+")
        self.proc = subprocess.Popen(
            ["dockerd", "--data-root", str(folder / "data"), "--exec-root", str(folder / "exec"),
             "--host", f"unix://{folder}/docker.sock", "--pidfile", str(folder / "dockerd.pid"),
             "--bridge", "none", "--iptables=false", "--ip-forward=false"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while self.docker("version", check=False).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start:\n{self.log_tail()}")
            time.sleep(0.5)

    def log_tail(self) -> str:
        self.log.seek(0)
        return self.log.read()[-4000:]

    def docker(self, *args: str, check=True, timeout=600, **kw) -> subprocess.CompletedProcess:
        run = subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True, timeout=timeout, **kw)
        if check and run.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)} failed:\n{run.stderr[-4000:]}")
        return run

    def build(self, tag: str, context: Path):
        self.docker("build", "--network", "host", "--tag", tag, str(context), timeout=1200)

    def stop(self):
        """SIGTERM by pid; dockerd stops its containerd. Then whatever it left mounted goes."""
        containerd_pid = self.folder / "exec" / "containerd" / "containerd.pid"
        containerd = int(containerd_pid.read_text()) if containerd_pid.exists() else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if containerd and Path(f"/proc/{containerd}").exists():
            os.kill(containerd, signal.SIGKILL)
        self.log.close()
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        for point in reversed(mounts):
            if point.startswith(f"{self.folder}/"):
                subprocess.run(["umount", "--lazy", point], check=False)


@pytest.fixture(scope="module")
def engine():
    folder = Path(tempfile.mkdtemp(prefix="vkllm-compose-"))   # short: dockerd's sockets live here
    try:
        engine = Engine(folder)
        try:
            yield engine
        finally:
            engine.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def from_image(dockerfile: Path) -> str:
    return re.search(r"^FROM\s+(\S+)", dockerfile.read_text(), re.MULTILINE).group(1)


@pytest.fixture(scope="module")
def images(engine):
    """Every image the four services run: the base the Dockerfile names, the two stand-ins and vkllm's."""
    log.info("dockerd up; making the base image")
    base = from_image(ROOT / "Dockerfile")
    assert base == "debian:bookworm-slim", "the base image is made here from Debian bookworm"
    # the proxy to PyPI presents a certificate of this machine's CA: pip in the build needs it
    certs = "/usr/local/share/ca-certificates"
    hook = f'mkdir -p "$1{certs}" && if [ -d {certs} ]; then cp -r {certs}/. "$1{certs}/"; fi'
    trace = engine.folder / "mmdebstrap.log"
    with open(trace, "w") as errors:
        mmdebstrap = subprocess.Popen(["mmdebstrap", "--variant=minbase", f"--customize-hook={hook}",
                                       "bookworm", "-", apt_mirror("bookworm")], stdout=subprocess.PIPE, stderr=errors)
        imported = engine.docker("import", "-", base, stdin=mmdebstrap.stdout, check=False)
    assert mmdebstrap.wait() == 0, trace.read_text()[-4000:]
    assert imported.returncode == 0, imported.stderr[-4000:]
    log.info("base image imported; building the stand-ins")
    for name, dockerfile in (("redis", REDIS_DOCKERFILE), ("prometheus", PROMETHEUS_DOCKERFILE)):
        context = engine.folder / f"stand-in-{name}"
        context.mkdir()
        (context / "Dockerfile").write_text(dockerfile.format(base=base))
        engine.build(COMPOSE["services"][name]["image"], context)
    log.info("building vkllm's image")
    engine.build(COMPOSE["x-vkllm"]["image"], ROOT)
    log.info("images built")


class Stack:
    def __init__(self, engine: Engine, project: Path, model: str, ports: dict[str, int]):
        self.engine, self.project, self.model, self.ports = engine, project, model, ports
        self.name = project.name.lower().replace("-", "")
        self.api = f"http://127.0.0.1:{ports['VKLLM_PORT']}"
        self.prometheus = f"http://127.0.0.1:{ports['PROMETHEUS_PORT']}"

    def compose(self, *args: str, check=True, timeout=600) -> subprocess.CompletedProcess:
        run = subprocess.run(["docker-compose", "--project-name", self.name, *args], cwd=self.project,
                             env=self.engine.env, capture_output=True, text=True, timeout=timeout)
        if check and run.returncode != 0:
            raise RuntimeError(f"docker-compose {' '.join(args)} failed:\n{run.stderr[-4000:]}")
        return run

    def logs(self) -> str:
        return self.compose("logs", "--no-color", "--tail", "40", check=False).stdout[-8000:]

    def inspect(self, service: str, field: str):
        [container] = self.compose("ps", "-q", service).stdout.split()
        return json.loads(self.engine.docker("inspect", "--format", f"{{{{json .{field}}}}}", container).stdout)

    def state(self, service: str) -> dict:
        return self.inspect(service, "State")

    def wait_healthy(self, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            states = {s: self.state(s) for s in SERVICES}
            broken = {s: st for s, st in states.items() if st["Status"] != "running" or st["Restarting"]}
            assert not broken, f"{broken}\n{self.logs()}"
            health = {s: st["Health"]["Status"] for s, st in states.items()}
            if set(health.values()) == {"healthy"}:
                return
            assert time.monotonic() < deadline, f"not healthy: {health}\n{self.logs()}"
            time.sleep(2)

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(
            self.api + path, method=method, data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    def query(self, promql: str) -> list[dict]:
        url = f"{self.prometheus}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(url, timeout=30) as response:
            answer = json.loads(response.read())
        assert answer["status"] == "success", answer
        return answer["data"]["result"]


@pytest.fixture(scope="module")
def stack(engine, images, tiny_model):
    """redis, api, worker (the cpu profile: no /dev/dri here) and prometheus from the compose file,
    healthy, with .env.example's settings and host ports other than the defaults."""
    project = engine.folder / "vkllm-stack"
    project.mkdir()
    ports = {"VKLLM_PORT": _free_port(), "PROMETHEUS_PORT": _free_port()}
    copy_project(project, env_file(COMPOSE_PROFILES="cpu", VKLLM_API_KEY=API_KEY, VKLLM_MODEL=tiny_model.name,
                                   VKLLM_N_CTX="256", GF_SECURITY_ADMIN_PASSWORD="compose-test",
                                   **{k: str(v) for k, v in ports.items()}))
    (project / "models").mkdir()
    shutil.copy(tiny_model, project / "models" / tiny_model.name)
    stack = Stack(engine, project, tiny_model.stem, ports)
    try:
        stack.compose("up", "--detach", "--no-build", *SERVICES, timeout=900)
        log.info("stack started")
        stack.wait_healthy(timeout=600)
        log.info("stack healthy")
        yield stack
    finally:
        stack.compose("down", "--volumes", "--remove-orphans", "--timeout", "20", check=False)
        log.info("stack removed")


def run_job(stack: Stack, prompt: str) -> tuple[dict, list[str]]:
    job = stack.call("POST", "/api/v1/jobs", {"model": stack.model, "prompt": prompt,
                                              "max_tokens": MAX_TOKENS, "temperature": 0})
    request = urllib.request.Request(f"{stack.api}/api/v1/jobs/{job['id']}/stream",
                                     headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request, timeout=300) as response:
        body = response.read().decode()
    events = [dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
              for block in body.strip().split("\n\n")]
    tokens = [json.loads(e["data"])["text"] for e in events if e.get("event") == "token"]
    assert events[-1]["event"] == "end", body[-2000:]
    # the end event can come before the job's record says so
    final = {}
    wait_for(lambda: final.update(stack.call("GET", f"/api/v1/jobs/{job['id']}")) or
             final["state"] not in ("queued", "running"), 60, lambda: f"job stayed {final['state']}")
    log.info("job %s: %s", job["id"], final["state"])
    return final, tokens


def wait_for(check, timeout: float, what):
    """Polls check() until it is true; `what()` says what was missing when it never is."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what()
        time.sleep(2)


def tokens_scraped(stack: Stack) -> float:
    found = stack.query("sum(vkllm_tokens_generated_total)")
    return float(found[0]["value"][1]) if found else 0.0


@pytest.fixture(scope="module")
def jobs(stack):
    """Two jobs with a Prometheus scrape between them, so every rate() in the dashboard has data."""
    first = run_job(stack, "Once upon a time")
    wait_for(lambda: tokens_scraped(stack) >= first[0]["usage"]["completion_tokens"], 120,
             lambda: "Prometheus never scraped the worker's token counter")
    second = run_job(stack, "The quick brown fox")
    return [first, second]


def test_stack_is_healthy_without_dri_on_another_port(stack):
    """All four services passed their own healthchecks (the api's probes port 8000 in the
    container while the host reaches it on VKLLM_PORT); the web app is ready on that port."""
    assert not stack.inspect("worker", "HostConfig.Devices")     # lavapipe: no device mapped
    [prometheus] = stack.inspect("prometheus", "HostConfig.PortBindings")["9090/tcp"]
    assert prometheus == {"HostIp": "127.0.0.1", "HostPort": str(stack.ports["PROMETHEUS_PORT"])}
    [api] = stack.inspect("api", "HostConfig.PortBindings")["8000/tcp"]
    assert api["HostPort"] == str(stack.ports["VKLLM_PORT"])
    with urllib.request.urlopen(f"{stack.api}/readyz", timeout=30) as response:
        assert response.status == 200
    models = stack.call("GET", "/api/v1/models")
    assert stack.model in json.dumps(models)


def test_job_through_the_api(jobs):
    for final, tokens in jobs:
        assert final["state"] == "finished", final
        assert final["usage"]["completion_tokens"] == MAX_TOKENS and final["finish_reason"] == "length"
        assert tokens and final["output"] == "".join(tokens)     # the SSE stream carried the whole text


def test_the_drivers_pipeline_cache_is_on_the_cache_volume(stack, jobs):
    """Mesa's compiled pipelines (lavapipe here) land in the worker's cache volume (the
    Dockerfile's MESA_SHADER_CACHE_DIR), so a recreated container starts warm."""
    listing = stack.compose("exec", "-T", "worker", "sh", "-c", "find /cache/mesa -type f | wc -l").stdout
    assert int(listing.strip()) > 0, listing


def test_prometheus_scrapes_both_targets(stack, jobs):
    with urllib.request.urlopen(f"{stack.prometheus}/api/v1/targets", timeout=30) as response:
        active = json.loads(response.read())["data"]["activeTargets"]
    assert {t["labels"]["job"]: t["health"] for t in active} == {"vkllm-api": "up", "vkllm-worker": "up"}
    assert {r["metric"]["job"] for r in stack.query("up == 1")} == {"vkllm-api", "vkllm-worker"}
    # the worker's counter, as scraped, adds up to what the API reported for the two jobs
    total = sum(final["usage"]["completion_tokens"] for final, _ in jobs)
    wait_for(lambda: tokens_scraped(stack) == total, 60, lambda: f"token counter {tokens_scraped(stack)}, not {total}")


def test_every_grafana_panel_has_data(stack, jobs):
    dashboard = json.loads((ROOT / "monitoring/grafana/dashboards/vkllm.json").read_text())
    exprs = {t["expr"]: panel["title"] for panel in dashboard["panels"] for t in panel["targets"]}
    assert len(exprs) >= len(dashboard["panels"])

    def empty() -> dict[str, str]:
        """The queries with no finite sample now (a histogram_quantile over a zero rate is NaN)."""
        return {expr: title for expr, title in exprs.items()
                if not any(math.isfinite(float(r["value"][1])) for r in stack.query(expr))}
    wait_for(lambda: not empty(), 90, lambda: f"panels without data: {empty()}")
