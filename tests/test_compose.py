"""The compose file validates with Debian's docker-compose (no engine needed) and wires what the
appliance needs; the monitoring files parse and point at the right places. The stack itself is
built and run in test_compose_stack.py."""
import json
import os
import runpy
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parent.parent


HOST_PORT = "8123"    # not the container's 8000: the host port must not leak into the container


def env_file(**changes: str) -> str:
    """.env.example with some of its settings changed."""
    lines = (ROOT / ".env.example").read_text().splitlines()
    for key, value in changes.items():
        [at] = [i for i, line in enumerate(lines) if line.startswith(f"{key}=")]
        lines[at] = f"{key}={value}"
    return "\n".join(lines) + "\n"


def copy_project(folder: Path, env: str) -> Path:
    shutil.copy(ROOT / "docker-compose.yml", folder)
    shutil.copytree(ROOT / "monitoring", folder / "monitoring")
    (folder / ".env").write_text(env)
    return folder


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The compose project as a user has it after `cp .env.example .env` and setting Grafana's
    password and another host port for the web app."""
    return copy_project(tmp_path_factory.mktemp("compose"),
                        env_file(GF_SECURITY_ADMIN_PASSWORD="s3cret", VKLLM_PORT=HOST_PORT))


def compose(project, *args: str, profiles: str = "cpu") -> subprocess.CompletedProcess:
    return subprocess.run(["docker-compose", *args], cwd=project, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "COMPOSE_PROFILES": profiles})


def config(project, profiles: str = "cpu") -> dict:
    run = compose(project, "config", profiles=profiles)
    assert run.returncode == 0, run.stderr
    return yaml.safe_load(run.stdout)


def published(port) -> tuple[str, int, int]:
    """(host address, host port, container port) of a `docker-compose config` ports entry."""
    if isinstance(port, dict):
        return port.get("host_ip", ""), int(port["published"]), int(port["target"])
    *host, target = port.split("/")[0].split(":")
    return (host[0] if len(host) == 2 else ""), int(host[-1]), int(target)


def test_compose_file_validates(project):
    run = compose(project, "config", "-q")
    assert run.returncode == 0, run.stderr
    assert set(compose(project, "config", "--profiles").stdout.split()) == {"cpu", "dri", "nvidia"}


def test_grafana_password_is_required(tmp_path):
    """.env.example as shipped leaves it empty: compose refuses, naming the setting."""
    (tmp_path / "empty").mkdir()
    run = compose(copy_project(tmp_path / "empty", env_file()), "config", "-q")
    assert run.returncode != 0 and "GF_SECURITY_ADMIN_PASSWORD" in run.stderr
    (tmp_path / "set").mkdir()
    grafana = config(copy_project(tmp_path / "set", env_file(GF_SECURITY_ADMIN_PASSWORD="x")))["services"]["grafana"]
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "x"


def test_unauthenticated_services_are_published_on_loopback(project, tmp_path):
    services = config(project)["services"]
    assert [published(p) for p in services["prometheus"]["ports"]] == [("127.0.0.1", 9090, 9090)]
    assert [published(p) for p in services["grafana"]["ports"]] == [("127.0.0.1", 3000, 3000)]
    lan = copy_project(tmp_path, env_file(GF_SECURITY_ADMIN_PASSWORD="x", PROMETHEUS_BIND="0.0.0.0"))
    assert [published(p) for p in config(lan)["services"]["prometheus"]["ports"]] == [("0.0.0.0", 9090, 9090)]


def test_api_listens_where_compose_maps_and_probes(project, monkeypatch):
    """VKLLM_PORT moves the host side only: gunicorn, given the api container's environment (which
    holds VKLLM_PORT through the env file), binds the port the mapping targets and the healthcheck
    probes."""
    api = config(project)["services"]["api"]
    assert api["environment"]["VKLLM_PORT"] == HOST_PORT
    [(_, host, target)] = [published(p) for p in api["ports"]]
    assert host == int(HOST_PORT)
    probe = next(arg for arg in api["healthcheck"]["test"] if arg.startswith("http://"))
    assert probe.split("/")[2] == f"localhost:{target}"
    for key in [k for k in os.environ if k.startswith(("VKLLM_", "PROMETHEUS_", "GUNICORN_"))]:
        monkeypatch.delenv(key)
    for key, value in api["environment"].items():
        monkeypatch.setenv(key, str(value))
    gunicorn = runpy.run_module("appliance.gunicorn_conf")
    assert gunicorn["bind"].rsplit(":", 1)[1] == str(target)


def test_services_are_wired(project):
    services = config(project, "cpu,dri,nvidia")["services"]
    assert {"redis", "api", "worker", "worker-dri", "worker-nvidia", "prometheus", "grafana"} <= set(services)
    redis = services["redis"]
    assert redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    assert redis["volumes"] == ["redis-data:/data:rw"]
    for name in ("redis", "api", "worker", "prometheus", "grafana"):
        assert services[name]["healthcheck"]["test"], name
    for name in ("api", "worker"):
        assert "VKLLM_API_KEY" in services[name]["environment"]      # from the env file
        assert any(v.split(":")[1] == "/models" for v in services[name]["volumes"])
    assert services["api"]["command"][0] == "gunicorn"
    assert "PROMETHEUS_MULTIPROC_DIR" in services["api"]["environment"]
    # the cpu worker maps no device, so it starts on a host without /dev/dri (lavapipe)
    assert not services["worker"].get("devices")
    assert services["worker-dri"]["devices"] == ["/dev/dri:/dev/dri"]
    for name in ("worker", "worker-dri", "worker-nvidia"):     # Prometheus scrapes worker:9400
        assert "worker" in services[name]["networks"]["default"]["aliases"], name
        assert services[name]["command"] == services["worker"]["command"], name
    nvidia = services["worker-nvidia"]
    assert nvidia["runtime"] == "nvidia" and not nvidia.get("devices")
    assert "graphics" in nvidia["environment"]["NVIDIA_DRIVER_CAPABILITIES"]


def test_monitoring_files():
    prometheus = yaml.safe_load((ROOT / "monitoring" / "prometheus.yml").read_text())
    targets = {t for job in prometheus["scrape_configs"] for c in job["static_configs"] for t in c["targets"]}
    assert targets == {"api:8000", "worker:9400"}
    datasource = yaml.safe_load((ROOT / "monitoring/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((ROOT / "monitoring/grafana/provisioning/dashboards/vkllm.yml").read_text())
    dashboard = json.loads((ROOT / "monitoring/grafana/dashboards/vkllm.json").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    uid = datasource["datasources"][0]["uid"]
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {uid}
