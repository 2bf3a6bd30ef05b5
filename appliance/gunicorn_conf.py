"""gunicorn settings for the web app in docker: threads for the long-lived event streams (in a
gthread worker that gives a thread only to a complete request head, see gunicorn_worker.py), and
prometheus_client's multiprocess bookkeeping so /metrics sums over the worker processes."""
import os
import shutil

from prometheus_client import multiprocess

# The container's port, which docker-compose.yml maps and health-checks. Not VKLLM_PORT: that is the
# host's side of the mapping, and the env file hands it to this container too. `--bind` overrides.
bind = "0.0.0.0:8000"
workers = int(os.environ.get("VKLLM_WEB_PROCESSES", "2"))
worker_class = "appliance.gunicorn_worker.Worker"
threads = int(os.environ.get("VKLLM_WEB_THREADS", "32"))   # each open SSE stream holds a thread
timeout = 120
accesslog = "-"


def on_starting(server):
    """Series files of a previous run would be summed into this one's: start empty."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)


def child_exit(server, worker):
    multiprocess.mark_process_dead(worker.pid)
