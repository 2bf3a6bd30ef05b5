"""The web app's Prometheus metrics, its health checks, and the HTTP request hooks.

Under gunicorn several processes serve requests, so when PROMETHEUS_MULTIPROC_DIR is set the
HTTP series are written to files there and /metrics merges them (prometheus_client's
multiprocess mode). Queue depth and jobs by state are read from Redis at scrape time, so
every process reports the same numbers."""
import time

from flask import Blueprint, Response, current_app, g, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from appliance import queue
from vkllm import outage

bp = Blueprint("metrics", __name__)

HTTP_REQUESTS = Counter("vkllm_http_requests", "HTTP requests by route and status.", ("route", "method", "status"))
HTTP_LATENCY = Histogram("vkllm_http_request_duration_seconds", "Time to produce the response (streams: the "
                         "headers).", ("route", "method"), buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                                                     2.5, 5, 10, 30, 60, 120, 300))


class QueueCollector:
    """Reads queue depth per model and jobs by state from Redis when scraped."""

    def __init__(self, app):
        self.app = app

    def collect(self):
        with self.app.app_context():
            depth = GaugeMetricFamily("vkllm_queue_depth", "Jobs waiting per model.", labels=("model",))
            for model, n in queue.queue_depths().items():
                depth.add_metric((model,), n)
            jobs = GaugeMetricFamily("vkllm_jobs", "Jobs known to Redis by state.", labels=("state",))
            for state, n in queue.job_counts().items():
                jobs.add_metric((state,), n)
            workers = GaugeMetricFamily("vkllm_workers", "Live GPU workers.")
            workers.add_metric((), len(queue.live_workers()))
        return [depth, jobs, workers]


class _ThisProcess:
    """Without a multiprocess folder: this process's own series, from the default registry."""

    def collect(self):
        return REGISTRY.collect()


def init_app(app) -> None:
    registry = CollectorRegistry()
    if app.config["METRICS_MULTIPROCESS"]:
        MultiProcessCollector(registry)
    else:
        registry.register(_ThisProcess())
    registry.register(QueueCollector(app))
    app.extensions["vkllm_metrics_registry"] = registry
    app.before_request(_start)
    app.after_request(_record)


def _start():
    g.request_started = time.perf_counter()


def _record(response):
    route = request.url_rule.rule if request.url_rule else "unmatched"
    HTTP_REQUESTS.labels(route, request.method, str(response.status_code)).inc()
    if "request_started" in g:
        HTTP_LATENCY.labels(route, request.method).observe(time.perf_counter() - g.request_started)
    return response


@bp.get("/metrics")
def metrics():
    return Response(generate_latest(current_app.extensions["vkllm_metrics_registry"]),
                    mimetype=CONTENT_TYPE_LATEST)


@bp.get("/healthz")
def healthz():
    return {"status": "ok"}


@bp.get("/readyz")
def readyz():
    """Ready when Redis answers, has room (a full one answers reads and PING but refuses new
    jobs: 503 store_full), and at least one worker serves a model."""
    try:
        r = queue.get_redis()
        r.ping()
        full = outage.full(r.info("memory"))
        workers = queue.live_workers()
    except Exception as e:  # any Redis failure means not ready; the log says which, not the body (its address)
        current_app.logger.warning("readyz: Redis %s: %s", outage.describe(e), e)
        return {"status": "unavailable", "redis": outage.describe(e)}, 503
    models = sorted(queue.models())
    status = "store full" if full else "ok" if models else "no workers"
    return {"status": status, "workers": len(workers), "models": models}, 200 if status == "ok" else 503
