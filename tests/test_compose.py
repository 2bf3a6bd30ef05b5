"""The compose file validates with Debian's docker-compose (no engine needed) and wires what the
appliance needs; the monitoring files parse and point at the right places."""
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The compose project as a user has it after `cp .env.example .env`."""
    folder = tmp_path_factory.mktemp("compose")
    shutil.copy(ROOT / "docker-compose.yml", folder)
    shutil.copytree(ROOT / "monitoring", folder / "monitoring")
    shutil.copy(ROOT / ".env.example", folder / ".env")
    return folder


def config(project, profiles: str) -> dict:
    run = subprocess.run(["docker-compose", "config"], cwd=project, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "COMPOSE_PROFILES": profiles}, check=True)
    return yaml.safe_load(run.stdout)


def test_compose_file_validates(project):
    run = subprocess.run(["docker-compose", "config", "-q"], cwd=project, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert set(subprocess.run(["docker-compose", "config", "--profiles"], cwd=project, capture_output=True,
                              text=True, check=True).stdout.split()) == {"dri", "nvidia"}


def test_services_are_wired(project):
    services = config(project, "dri")["services"]
    assert {"redis", "api", "worker", "prometheus", "grafana"} <= set(services)
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
    assert services["worker"]["devices"] == ["/dev/dri:/dev/dri"]
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
