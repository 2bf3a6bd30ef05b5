"""The GPU worker (`vkllm worker`): an RQ SimpleWorker that keeps its models resident.

SimpleWorker runs jobs in its own process, so the weights loaded at start stay in VRAM across
jobs. A thread keeps the heartbeats alive while a long generation holds the main thread, and
publishes what this worker serves (models, context, device stats) under a short-lived key:
the web app learns which models exist from there, and a job whose worker stopped refreshing it
(killed) is failed by any other worker or by the web app (vkllm.orphans), its partial output
left in its stream. Another thread counts prompt tokens for the web app (worker.service.tokenize).

Redis may go away for a while (a restart, a network cut): every command of RQ and of these threads
waits it out (the connection retries with backoff, without end), and a running job keeps
generating into its outbox (worker.service.outbox), which catches up once Redis is back."""
import contextvars
import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path

from redis import Redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError, TimeoutError
from redis.retry import Retry
from rq import SimpleWorker, get_current_job
from rq.job import Job, JobStatus

from vkllm import orphans, protocol, sampling_defaults
from vkllm.errors import VkllmError
from worker.engine.generation import Timings
from worker.engine.sampling import SamplingParams
from worker.engine.toolcalls import ToolCallParser, format_for
from worker.service.metrics import WorkerMetrics
from worker.service.outbox import Outbox
from worker.service.tokenize import TokenCounter

log = logging.getLogger(__name__)
UNREACHABLE = (ConnectionError, TimeoutError)
_current_worker: contextvars.ContextVar["GPUWorker"] = contextvars.ContextVar("vkllm_worker")


def run_job(request: dict) -> dict:
    """The RQ job function, enqueued by name by the web app; the worker running it holds the model."""
    return _current_worker.get().generate(get_current_job(), request)


class _SharedRetry(Retry):
    """redis-py copies a client's retry policy into each connection; this one stays one object,
    so that a stop can cut short the waits already under way (see GPUWorker.request_stop)."""

    def __deepcopy__(self, memo):
        return self


def connect(url: str) -> tuple[Redis, Redis]:
    """Two clients of the worker's Redis: one whose commands wait out any outage (RQ, the
    threads), and one that fails at once, for the running job's outbox and the outage checks."""
    patient = Redis.from_url(url, socket_connect_timeout=5, retry_on_error=list(UNREACHABLE),
                             retry=_SharedRetry(ExponentialWithJitterBackoff(base=0.1, cap=2.0), -1))
    prompt = Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10, retry=Retry(
        ExponentialWithJitterBackoff(), 0))
    return patient, prompt


class GPUWorker(SimpleWorker):
    def __init__(self, engines: dict, connection: Redis, link: Redis, *, metrics: WorkerMetrics,
                 metrics_port: int, heartbeat_interval: float = 5.0, stream_ttl: int = 7 * 86400, **kwargs):
        # batch lines come last: RQ takes the first non-empty queue in this order
        queues = [protocol.queue_name(name) for name in engines] + [protocol.batch_queue_name(name) for name in engines]
        # RQ logs a job's description (its arguments: the prompt) unless told not to
        super().__init__(queues, connection=connection, name=metrics.worker, log_job_description=False, **kwargs)
        self.link = link   # connection (see connect) is patient; this one answers at once
        self.instance = uuid.uuid4().hex
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
        self._forget_dead_namesake()
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
            try:
                self.link.delete(protocol.worker_key(self.name))
            except UNREACHABLE:   # the key expires by itself
                pass

    def _forget_dead_namesake(self) -> None:
        """RQ refuses to start under a name whose last holder never said goodbye (killed): its
        record lingers for minutes. That holder is dead once its liveness key is gone."""
        if not self.connection.exists(protocol.worker_key(self.name)) and \
                not self.connection.hexists(self.key, "death"):
            self.connection.delete(self.key)

    def request_stop(self, signum, frame):
        """A stop ends the patience: from now on every Redis command (those waiting included) is
        tried a few times, not for ever, so that a stop during an outage ends."""
        self.connection.get_retry().update_retries(3)
        super().request_stop(signum, frame)

    def teardown(self):
        try:
            super().teardown()
        except UNREACHABLE as e:
            log.warning("Redis unreachable at shutdown (%s); this worker's RQ record expires by itself", e)

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
        down = False
        while not stop.wait(self.interval):
            try:
                self.link.ping()
            except UNREACHABLE as e:
                if not down:
                    log.warning("Redis unreachable (%s); waiting for it", e)
                down = True
                continue
            try:
                if down:
                    self._register_again()
                    down = False
                self.publish()
                job, execution = self._job, self.execution
                if job is not None and execution is not None:
                    self.maintain_heartbeats(job, execution)
                self.fail_orphans()
            except Exception:  # a Redis hiccup must not end the heartbeat for good
                log.exception("heartbeat failed")

    def _register_again(self) -> None:
        """After an outage: RQ's record of this worker is back with Redis's data, or made anew."""
        log.info("Redis is back; worker %s registers again", self.name)
        if not self.connection.exists(self.key):
            self.register_birth()

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
                "tokens_per_second": self.last_tokens_per_second, "instance": self.instance,
            })
            pipe.expire(key, self.liveness_ttl)
            pipe.sadd(protocol.WORKERS, self.name)
            pipe.hset(protocol.MODELS, mapping={name: json.dumps(m) for name, m in self.models.items()})
            if self._job is not None:   # alive: no sweep may count this job as orphaned
                pipe.delete(protocol.orphan_key(self._job.id))
            pipe.execute()

    def fail_orphans(self) -> None:
        """Fail started jobs of this worker's models whose worker died (vkllm.orphans)."""
        orphans.reap(self.queues, self.stream_ttl)

    def generate(self, job: Job, request: dict) -> dict:
        """Run one job: tokens go to the job's stream as they come, progress to job.meta."""
        model = request["model"]
        if model not in self.engines:
            raise VkllmError(f"model {model!r} is not loaded on worker {self.name}")
        engine = self.engines[model]
        self._job = job
        started = time.monotonic()
        timings, finish, count, pieces, tool_calls = Timings(), None, 0, [], []
        cancel_key = protocol.cancel_key(job.id)
        outbox = Outbox(self.link, protocol.stream_key(job.id), orphans.stream_lifetime(job, self.stream_ttl))
        # for the watchdog (vkllm.orphans): how long to wait for this worker, and which start
        # of it runs the job (a worker restarted under the same name does not)
        job.meta |= {"liveness_ttl": self.liveness_ttl, "worker_instance": self.instance}
        job.save_meta()
        # progress during generation goes through the link, so an outage does not hold it up
        progress = Job(job.id, connection=self.link)
        progress.meta = job.meta
        try:
            params = SamplingParams(**sampling_defaults.fill(request["params"], engine.sampling_defaults))
            messages, tools = request.get("messages"), request.get("tools")
            prompt = engine.render_chat(messages, tools) if messages is not None else request["prompt"]
            # tool calls are parsed where the request offered tools and the template teaches a format
            fmt = format_for(engine.chat_template) if tools else None
            calls = ToolCallParser(fmt) if fmt else None
            last_meta = 0.0

            def cancelled() -> bool:   # while Redis is away: not cancelled, as far as we know
                return bool(outbox.call(lambda: self.link.exists(cancel_key), False))

            for event in engine.generate(prompt, params, cancelled, request.get("logprobs"), request.get("constraint")):
                text = calls.push(event.text) if calls else event.text
                if event.finish_reason is not None and calls:
                    held, tool_calls = calls.finish()
                    text += held
                logprobs = _logprobs(engine.tokenizer, event) if event.logprobs else None
                if text or logprobs:
                    pieces.append(text)
                    outbox.send(protocol.record(protocol.TOKEN, text=text,
                                                **({"logprobs": logprobs} if logprobs else {})))
                if event.finish_reason is not None:
                    finish, timings = event.finish_reason, event.timings
                    break
                count += 1
                self.metrics.token(model)
                if time.monotonic() - last_meta > 0.5:
                    job.meta["progress"] = {"tokens": count, "max_tokens": params.max_tokens}
                    outbox.call(progress.save_meta, None)
                    last_meta = time.monotonic()
            job.meta["progress"] = {"tokens": count, "max_tokens": params.max_tokens}
            job.save_meta()
        except BaseException as e:   # also a shutdown (SystemExit) in the middle of a job
            kind = "invalid_request" if isinstance(e, VkllmError) else "server_error"
            reason = (str(e) or type(e).__name__) if isinstance(e, Exception) else "the worker was shut down"
            outbox.send(protocol.record(protocol.ERROR, error=reason, kind=kind))
            # a shutdown waits for Redis a little, not for ever
            outbox.drain(None if isinstance(e, Exception) else time.monotonic() + 5)
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
            **({"tool_calls": tool_calls} if tool_calls else {}),
        }
        outbox.send(protocol.record(protocol.END, **{k: v for k, v in result.items() if k != "text"}))
        outbox.drain()
        return result


def _logprobs(tokenizer, event) -> dict:
    """A token's logprobs as OpenAI's chat API spells them: text, log-probability, UTF-8 bytes."""
    def entry(token: int, logprob: float) -> dict:
        raw = tokenizer.token_bytes(token)   # empty for a control token: its text names it
        return {"token": raw.decode("utf-8", "replace") if raw else tokenizer.token_text(token),
                "logprob": logprob, "bytes": list(raw)}
    return entry(event.token_id, event.logprobs.logprob) | {
        "top_logprobs": [entry(token, logprob) for token, logprob in event.logprobs.top]}


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
        from worker.engine.engine import Engine
        load = Engine.load
    engines = {}
    for spec in specs:
        engine = load(resolve_model(spec, settings.models_dir), settings, n_ctx=n_ctx)
        engines[engine.name] = engine
    return engines


def serve(args, settings, load=None) -> int:
    """`vkllm worker`: load the models, expose metrics, serve their queues until stopped."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    connection, link = connect(args.redis_url)
    engines = load_engines(args.model, settings, args.n_ctx, load)
    # host and pid are not unique enough: a container restarted keeps both (pid 1), and RQ refuses
    # a name whose last holder was killed (its record lingers for minutes)
    name = args.name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    metrics = WorkerMetrics(name)
    for model, engine in engines.items():
        metrics.loaded(model, engine.stats())
    port = metrics.serve(args.metrics_port, args.metrics_host)
    log.info("worker %s serving %s; metrics on %s port %d", name, ", ".join(engines), args.metrics_host, port)
    worker = GPUWorker(engines, connection, link, metrics=metrics, metrics_port=port,
                       heartbeat_interval=args.heartbeat_interval)
    try:
        worker.work(burst=args.burst, logging_level="INFO")
    finally:
        for engine in engines.values():
            engine.close()
    return 0
