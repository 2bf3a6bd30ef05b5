"""The GPU worker (`vkllm worker`): an RQ SimpleWorker that keeps its models resident.

SimpleWorker runs jobs in its own process, so the weights loaded at start stay in VRAM across
jobs. A thread keeps the heartbeats alive while a long generation holds the main thread, and
publishes what this worker serves (models, context, device stats) under a short-lived key:
the web app learns which models exist from there, and a job whose worker stopped refreshing it
(killed) is failed by any other worker, its partial output left in its stream. Another thread
counts prompt tokens for the web app (worker.tokenize_service)."""
import contextvars
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

from redis import Redis
from rq import SimpleWorker, get_current_job
from rq.job import Job, JobStatus

from appliance import protocol, sampling_defaults
from worker.errors import VkllmError
from worker.generation import Timings
from worker.metrics import WorkerMetrics
from worker.sampling import SamplingParams
from worker.tokenize_service import TokenCounter

log = logging.getLogger(__name__)
_current_worker: contextvars.ContextVar["GPUWorker"] = contextvars.ContextVar("vkllm_worker")


def run_job(request: dict) -> dict:
    """The RQ job function, enqueued by name by the web app; the worker running it holds the model."""
    return _current_worker.get().generate(get_current_job(), request)


class GPUWorker(SimpleWorker):
    def __init__(self, engines: dict, connection: Redis, *, metrics: WorkerMetrics, metrics_port: int,
                 heartbeat_interval: float = 5.0, stream_ttl: int = 7 * 86400, **kwargs):
        queues = [protocol.queue_name(name) for name in engines]
        super().__init__(queues, connection=connection, name=metrics.worker, **kwargs)
        self.engines = engines
        self.models = {name: {"n_ctx": e.n_ctx, "info": e.info, "max_token_bytes": _max_token_bytes(e.tokenizer),
                              "sampling_defaults": e.sampling_defaults}
                       for name, e in engines.items()}
        self.metrics = metrics
        self.metrics_port = metrics_port
        self.interval = heartbeat_interval
        self.liveness_ttl = max(2, int(3 * heartbeat_interval))
        self.stream_ttl = stream_ttl
        self.last_tokens_per_second = 0.0
        self._job: Job | None = None
        self._cancelled: str | None = None   # id of the last job that ended by cancellation

    # RQ's own heartbeat would only come between jobs; ours comes from a thread every interval.
    # RQ gives up on a job well after our liveness key expires, so that fail_orphans, which
    # says why and marks the stream, normally gets there first.
    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        return 2 * self.liveness_ttl + int(self.interval)

    def work(self, *args, **kwargs) -> bool:
        counter = TokenCounter(self.engines, self.connection)
        counter.start()   # before publish: the web app asks for counts once it sees the models
        self.publish()
        self.fail_orphans()
        stop = threading.Event()
        beat = threading.Thread(target=self._beat, args=(stop,), name="vkllm-heartbeat", daemon=True)
        beat.start()
        try:
            return super().work(*args, **kwargs)
        finally:
            stop.set()
            beat.join()
            counter.stop()
            self.connection.delete(protocol.worker_key(self.name))

    def execute_job(self, job, queue):
        token = _current_worker.set(self)
        try:
            super().execute_job(job, queue)
        finally:
            _current_worker.reset(token)

    def handle_job_success(self, job, queue, started_job_registry, execution):
        """A generation stopped by cancellation returns normally; file it with the cancelled jobs."""
        super().handle_job_success(job, queue, started_job_registry, execution)
        if job.id == self._cancelled:
            with self.connection.pipeline() as pipe:
                queue.finished_job_registry.remove(job, pipeline=pipe)
                job.set_status(JobStatus.CANCELED, pipeline=pipe)
                queue.canceled_job_registry.add(job, pipeline=pipe)
                pipe.execute()

    def _beat(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            try:
                self.publish()
                job, execution = self._job, self.execution
                if job is not None and execution is not None:
                    self.maintain_heartbeats(job, execution)
                self.fail_orphans()
            except Exception:  # a Redis hiccup must not end the heartbeat for good
                log.exception("heartbeat failed")

    def publish(self) -> None:
        """Tell the web app what this worker serves; the key dies with the worker."""
        stats = {name: engine.stats() for name, engine in self.engines.items()}
        for name, device in stats.items():
            self.metrics.device_stats(name, device)
        key = protocol.worker_key(self.name)
        with self.connection.pipeline() as pipe:
            pipe.hset(key, mapping={
                "name": self.name, "hostname": socket.gethostname(), "pid": os.getpid(),
                "models": json.dumps(self.models), "stats": json.dumps(stats),
                "metrics_port": self.metrics_port, "job": self._job.id if self._job else "",
                "tokens_per_second": self.last_tokens_per_second,
            })
            pipe.expire(key, self.liveness_ttl)
            pipe.sadd(protocol.WORKERS, self.name)
            pipe.execute()

    def fail_orphans(self) -> None:
        """Fail started jobs whose worker no longer refreshes its key (killed, host gone).

        Their registry entry is expired at once and RQ's own abandoned-job cleanup fails them;
        the stream gets an error record first, so readers see why and keep the partial text."""
        for queue in self.queues:
            if not queue.acquire_maintenance_lock():   # another worker is at it
                continue
            try:
                self._fail_orphans_of(queue.started_job_registry)
            finally:
                queue.release_maintenance_lock()

    def _fail_orphans_of(self, registry) -> None:
        for job_id, execution_id in registry.get_job_and_execution_ids(cleanup=False):
            job = Job.fetch(job_id, connection=self.connection) if Job.exists(job_id, self.connection) else None
            owner = job.worker_name if job else None
            if not owner or owner == self.name or self.connection.exists(protocol.worker_key(owner)):
                continue
            self._end_stream(job_id, protocol.record(
                protocol.ERROR, kind="server_error",
                error=f"the worker running this job ({owner}) stopped; the text generated before that is kept"))
            self.connection.zadd(registry.key, {f"{job_id}:{execution_id}": 0}, xx=True)
        registry.cleanup()

    def _end_stream(self, job_id: str, fields: dict) -> None:
        key = protocol.stream_key(job_id)
        with self.connection.pipeline() as pipe:
            pipe.xadd(key, fields)
            pipe.expire(key, self.stream_ttl)
            pipe.execute()

    def generate(self, job: Job, request: dict) -> dict:
        """Run one job: tokens go to the job's stream as they come, progress to job.meta."""
        model = request["model"]
        if model not in self.engines:
            raise VkllmError(f"model {model!r} is not loaded on worker {self.name}")
        engine = self.engines[model]
        self._job = job
        started = time.monotonic()
        timings, finish, count, pieces = Timings(), None, 0, []
        cancel_key, stream = protocol.cancel_key(job.id), protocol.stream_key(job.id)
        try:
            params = SamplingParams(**sampling_defaults.fill(request["params"], engine.sampling_defaults))
            messages = request.get("messages")
            prompt = engine.render_chat(messages) if messages is not None else request["prompt"]
            last_meta = 0.0
            for event in engine.generate(prompt, params, lambda: bool(self.connection.exists(cancel_key))):
                if event.text:
                    pieces.append(event.text)
                    self.connection.xadd(stream, protocol.record(protocol.TOKEN, text=event.text))
                if event.finish_reason is not None:
                    finish, timings = event.finish_reason, event.timings
                    break
                count += 1
                self.metrics.token(model)
                if time.monotonic() - last_meta > 0.5:
                    self._progress(job, count, params.max_tokens)
                    last_meta = time.monotonic()
            self._progress(job, count, params.max_tokens)
        except BaseException as e:   # also a shutdown (SystemExit) in the middle of a job
            kind = "invalid_request" if isinstance(e, VkllmError) else "server_error"
            reason = (str(e) or type(e).__name__) if isinstance(e, Exception) else "the worker was shut down"
            self._end_stream(job.id, protocol.record(protocol.ERROR, error=reason, kind=kind))
            raise
        finally:
            self.metrics.job_done(model, timings, time.monotonic() - started)
            self.last_tokens_per_second = timings.generation_tokens_per_second or self.last_tokens_per_second
            self._job = None
        self._cancelled = job.id if finish == "cancelled" else None
        result = {
            "text": "".join(pieces), "finish_reason": finish,
            "usage": {"prompt_tokens": timings.prompt_tokens, "completion_tokens": timings.generated_tokens},
            "timings": {"time_to_first_token": timings.time_to_first_token,
                        "prompt_tokens_per_second": timings.prompt_tokens_per_second,
                        "generation_tokens_per_second": timings.generation_tokens_per_second},
        }
        self._end_stream(job.id, protocol.record(protocol.END, **{k: v for k, v in result.items() if k != "text"}))
        return result

    @staticmethod
    def _progress(job: Job, tokens: int, max_tokens: int) -> None:
        job.meta["progress"] = {"tokens": tokens, "max_tokens": max_tokens}
        job.save_meta()


def _max_token_bytes(tokenizer) -> int:
    """The longest token in bytes: with it the web app, which has no tokenizer, can refuse a
    prompt that cannot fit the context whatever it tokenizes to."""
    return max(len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size))


def resolve_model(spec: str, models_dir: Path) -> Path:
    """A model is given as a path or as a file name (with or without .gguf) in the models folder."""
    for candidate in (Path(spec), models_dir / spec, models_dir / f"{spec}.gguf"):
        if candidate.is_file():
            return candidate
    raise VkllmError(f"model {spec!r} not found (as a path or in {models_dir})")


def load_engines(specs: list[str], settings, n_ctx: int | None, load=None) -> dict:
    """Load every model once, before serving; a model that fails to load stops the worker."""
    if load is None:
        from worker.engine import Engine
        load = Engine.load
    engines = {}
    for spec in specs:
        engine = load(resolve_model(spec, settings.models_dir), settings, n_ctx=n_ctx)
        engines[engine.name] = engine
    return engines


def serve(args, settings, load=None) -> int:
    """`vkllm worker`: load the models, expose metrics, serve their queues until stopped."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    connection = Redis.from_url(args.redis_url)
    engines = load_engines(args.model, settings, args.n_ctx, load)
    name = args.name or f"{socket.gethostname()}-{os.getpid()}"
    metrics = WorkerMetrics(name)
    for model, engine in engines.items():
        metrics.loaded(model, engine.stats())
    port = metrics.serve(args.metrics_port)
    log.info("worker %s serving %s; metrics on port %d", name, ", ".join(engines), port)
    worker = GPUWorker(engines, connection, metrics=metrics, metrics_port=port,
                       heartbeat_interval=args.heartbeat_interval)
    try:
        worker.work(burst=args.burst, logging_level="INFO")
    finally:
        for engine in engines.values():
            engine.close()
    return 0
