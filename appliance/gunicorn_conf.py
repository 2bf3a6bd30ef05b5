"""gunicorn settings for the web app in docker: threads for the long-lived event streams (in a
gthread worker that gives a thread only to a complete request head, see gunicorn_worker.py), and
prometheus_client's multiprocess bookkeeping so /metrics sums over the worker processes."""
import os
import shutil

from prometheus_client import multiprocess

from vkllm.config import WebServer

_settings = WebServer.from_env()

# The container's port, which docker-compose.yml maps and health-checks. Not VKLLM_PORT: that is the
# host's side of the mapping, and the env file hands it to this container too. `--bind` overrides.
bind = "0.0.0.0:8000"
workers = _settings.processes
worker_class = "appliance.gunicorn_worker.Worker"
threads = _settings.threads
timeout = 120
accesslog = "-"


def on_starting(server):
    """Series files of a previous run would be summed into this one's: start empty."""
    folder = _settings.metrics_dir
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)


def child_exit(server, worker):
    multiprocess.mark_process_dead(worker.pid)
