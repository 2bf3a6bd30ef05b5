"""The appliance commands' defaults come from VKLLM_* once, when the parser is built."""
from vkllm.cli import build_parser
from vkllm.config import CommandDefaults, WebServer, worker_environment


def test_environment_or_built_in_defaults():
    env = {"VKLLM_REDIS_URL": "redis://r:1/2", "VKLLM_METRICS_PORT": "9999", "VKLLM_URL": "http://a:1",
           "VKLLM_API_KEY": "k", "VKLLM_MODELS_DIR": "/m"}
    assert CommandDefaults.from_env(env) == CommandDefaults("redis://r:1/2", 9999, "http://a:1", "k", "/m")
    assert CommandDefaults.from_env({}) == CommandDefaults()
    assert CommandDefaults.from_env({"VKLLM_API_KEY": ""}).api_key is None


def test_parser_takes_them_as_argument_defaults(monkeypatch):
    monkeypatch.setenv("VKLLM_REDIS_URL", "redis://elsewhere:6400/0")
    monkeypatch.setenv("VKLLM_API_KEY", "secret")
    monkeypatch.setenv("VKLLM_MODELS_DIR", "/srv/models")
    parser = build_parser()
    worker = parser.parse_args(["worker", "-m", "x.gguf"])
    up = parser.parse_args(["up"])
    rotate = parser.parse_args(["apikey", "rotate"])
    assert worker.redis_url == "redis://elsewhere:6400/0" and worker.metrics_port == 9400
    assert (up.api_key, up.models_dir) == ("secret", "/srv/models")
    assert rotate.key_in_env and rotate.redis_url == "redis://elsewhere:6400/0"
    assert parser.parse_args(["up", "--models-dir", "here"]).models_dir == "here"


def test_web_server_settings_from_the_environment():
    env = {"VKLLM_WEB_PROCESSES": "4", "VKLLM_WEB_THREADS": "8", "PROMETHEUS_MULTIPROC_DIR": "/tmp/prom"}
    assert WebServer.from_env(env) == WebServer(4, 8, "/tmp/prom")
    assert WebServer.from_env({"PROMETHEUS_MULTIPROC_DIR": ""}) == WebServer(2, 32, None)


def test_the_worker_inherits_the_environment_but_the_web_secrets():
    env = {"PATH": "/bin", "VKLLM_API_KEY": "k", "VKLLM_SECRET_KEY": "s", "VKLLM_DEVICE": "1",
           "VKLLM_MODELS_DIR": "/old"}
    assert worker_environment("/m", env) == {"PATH": "/bin", "VKLLM_DEVICE": "1", "VKLLM_MODELS_DIR": "/m"}
