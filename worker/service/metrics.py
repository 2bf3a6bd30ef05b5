"""Prometheus metrics of one GPU worker, served on its own HTTP port.

Names mirror vLLM's meaning (time to first token, time per output token, KV cache usage) so
Grafana users recognise them; every series carries the model and worker labels, initialised when
the model is loaded so dashboards show zeros rather than gaps."""
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

from worker.engine.generation import Timings

LABELS = ("model", "worker")
# a device's place in its model's layer split ("0" unsplit): two contexts may share one GPU
DEVICE_LABELS = (*LABELS, "device")
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
JOB_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800, 86400)


class WorkerMetrics:
    def __init__(self, worker: str, registry: CollectorRegistry | None = None):
        self.worker = worker
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.tokens_generated = Counter("vkllm_tokens_generated", "Tokens generated.", LABELS, registry=r)
        self.prompt_tokens = Counter("vkllm_prompt_tokens", "Prompt tokens of jobs whose prefill was done.",
                                     LABELS, registry=r)
        self.tokens_per_second = Gauge("vkllm_generation_tokens_per_second",
                                       "Decode speed of the last finished job.", LABELS, registry=r)
        self.ttft = Histogram("vkllm_time_to_first_token_seconds", "Time to first token.", LABELS,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("vkllm_time_per_output_token_seconds", "Mean decode time per token of a job.",
                              LABELS, buckets=TOKEN_BUCKETS, registry=r)
        self.job_duration = Histogram("vkllm_job_duration_seconds", "Wall time of a job on the worker.",
                                      LABELS, buckets=JOB_BUCKETS, registry=r)
        self.vram_used = Gauge("vkllm_vram_used_bytes", "Device memory used, per device of the model's split.",
                               DEVICE_LABELS, registry=r)
        self.vram_total = Gauge("vkllm_vram_total_bytes", "Device memory budget, per device of the model's "
                                "split.", DEVICE_LABELS, registry=r)
        self.kv_usage = Gauge("vkllm_kv_cache_usage_ratio", "Share of the KV cache in use (0-1).",
                              LABELS, registry=r)
        self.model_loaded = Gauge("vkllm_model_loaded", "1 while the model is resident.", LABELS, registry=r)
        # the continuous batch (vLLM's num_requests_running, prefix_cache_hits, KV blocks)
        self.running = Gauge("vkllm_num_requests_running", "Sequences in the batch (joining or decoding).",
                             LABELS, registry=r)
        self.prefix_hits = Counter("vkllm_prefix_cache_hit_tokens", "Prompt tokens whose KV came from the "
                                   "prefix cache instead of a prefill.", LABELS, registry=r)
        self.kv_blocks_used = Gauge("vkllm_kv_cache_used_blocks", "KV cache blocks in use.", LABELS, registry=r)
        self.kv_blocks_free = Gauge("vkllm_kv_cache_free_blocks", "KV cache blocks free.", LABELS, registry=r)
        self._all = (self.tokens_generated, self.prompt_tokens, self.tokens_per_second, self.ttft, self.tpot,
                     self.job_duration, self.vram_used, self.vram_total, self.kv_usage, self.model_loaded,
                     self.running, self.prefix_hits, self.kv_blocks_used, self.kv_blocks_free)
        self._hits_seen: dict[str, int] = {}   # model -> the batch's cumulative hit count last seen

    def loaded(self, model: str, stats: dict) -> None:
        for metric in self._all:
            if metric not in (self.vram_used, self.vram_total):
                metric.labels(model, self.worker)
        self.model_loaded.labels(model, self.worker).set(1)
        self.device_stats(model, stats)

    def device_stats(self, model: str, stats: dict) -> None:
        for i, device in enumerate(stats["devices"]):
            self.vram_used.labels(model, self.worker, str(i)).set(device["vram_used_bytes"])
            self.vram_total.labels(model, self.worker, str(i)).set(device["vram_total_bytes"])
        self.kv_usage.labels(model, self.worker).set(stats["kv_cache_usage_ratio"])

    def batch(self, model: str, stats: dict) -> None:
        """A step's view of the model's batch (worker.engine.batch Batch.stats)."""
        labels = (model, self.worker)
        self.running.labels(*labels).set(stats["sequences"])
        self.kv_blocks_used.labels(*labels).set(stats["kv_blocks_used"])
        self.kv_blocks_free.labels(*labels).set(stats["kv_blocks_total"] - stats["kv_blocks_used"])
        hits = stats["prefix_hit_tokens"]
        self.prefix_hits.labels(*labels).inc(hits - self._hits_seen.get(model, 0))
        self._hits_seen[model] = hits

    def token(self, model: str) -> None:
        self.tokens_generated.labels(model, self.worker).inc()

    def job_done(self, model: str, timings: Timings, seconds: float) -> None:
        """Called once per job that ran (finished, cancelled or failed after starting). As vLLM
        counts them, its prompt tokens and its time to first token once its prefill is done, its
        first token out: a job that ended before (cancelled mid-prompt) counts only its duration."""
        labels = (model, self.worker)
        self.job_duration.labels(*labels).observe(seconds)
        if timings.prefilled:
            self.prompt_tokens.labels(*labels).inc(timings.prompt_tokens)
            self.ttft.labels(*labels).observe(timings.time_to_first_token)
        if timings.generated_tokens > 1 and timings.generation_seconds > 0:
            self.tpot.labels(*labels).observe(timings.generation_seconds / (timings.generated_tokens - 1))
            self.tokens_per_second.labels(*labels).set(timings.generation_tokens_per_second)

    def serve(self, port: int, addr: str = "0.0.0.0"):
        """Start the /metrics HTTP server in a daemon thread; port 0 picks a free one."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server.server_address[1]
