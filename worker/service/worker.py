"""The GPU worker (`vkllm worker`): an RQ SimpleWorker that keeps its models resident and runs
many jobs at once, one continuous batch per model (worker.engine.batch).

RQ hands the worker a job when it is idle (its blocking dequeue, which takes the job into this
worker's taking list: worker.service.taking). That job starts the batch loop:
each step runs every model's batch once, then one Redis round trip carries all the jobs' new
stream records, cancel checks and progress; between steps more jobs join, taken from the
worker's queues without blocking (interactive queues before batch queues, while their model's
batch has room), and jobs whose sequence ended are filed with RQ. When no job is left the loop
hands back to RQ, which waits for the next. Every job is a proper RQ job: an execution in the
StartedJobRegistry while it runs, then finished, failed or cancelled with its result.

A thread keeps the heartbeats of all running jobs alive and publishes what this worker serves
(models, context, device stats, running jobs) under a short-lived key: the web app learns which
models exist from there, and a job whose worker stopped refreshing it (killed) is failed by any
other worker or by the web app (vkllm.orphans), its partial output left in its stream. Another
thread counts prompt tokens for the web app (worker.service.tokenize).

Redis may go away for a while (a restart, a network cut), or refuse writes (a full disk: MISCONF;
Redis at its maxmemory: OOM; vkllm.outage counts both as away too): every command of RQ and of
these threads waits it out (the connection retries with backoff, without end), and the batch keeps generating
into the outbox (worker.service.outbox), which catches up once Redis is back. Meanwhile no job
joins, and a job that ends is filed once Redis has its whole stream."""
import contextvars
import json
import logging
import os
import signal
import socket
import threading
import time
import uuid

from redis import Redis
from rq import Queue, SimpleWorker, get_current_job
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.utils import now
from rq.worker import WorkerStatus

from vkllm import orphans, protocol
from vkllm.outage import UNAVAILABLE
from worker.service.jobrun import JobRun
from worker.service.metrics import WorkerMetrics
from worker.service.outbox import Outbox
from worker.service.taking import Taking, queue_class
from worker.service.tokenize import TokenCounter

log = logging.getLogger(__name__)
PROGRESS_INTERVAL = 0.5   # seconds between a running job's progress updates in job.meta
PUBSUB_POLL = 1.0   # seconds the command channel's thread waits per read (GPUWorker.subscribe)
_current_worker: contextvars.ContextVar["GPUWorker"] = contextvars.ContextVar("vkllm_worker")


def run_job(request: dict) -> None:
    """The RQ job function, enqueued by name by the web app: the request joins the batch of the
    worker running it (a bad request raises here), which files the job when its sequence ends."""
    _current_worker.get().join(get_current_job(), request)


class GPUWorker(SimpleWorker):
    def __init__(self, engines: dict, connection: Redis, link: Redis, *, metrics: WorkerMetrics,
                 metrics_port: int, heartbeat_interval: float = 5.0, stream_ttl: int = 7 * 86400, **kwargs):
        # batch lines come last: jobs are taken from the first non-empty queue in this order
        queues = [protocol.queue_name(name) for name in engines] + [protocol.batch_queue_name(name) for name in engines]
        self.instance = uuid.uuid4().hex
        self.interval = heartbeat_interval
        self.liveness_ttl = max(2, int(3 * heartbeat_interval))
        # every take, RQ's idle one too, moves the job into this start's taking list (taking.py)
        self.taking = Taking(connection, metrics.worker, self.instance, self.liveness_ttl)
        # RQ logs a job's description (its arguments: the prompt) unless told not to
        super().__init__(queues, connection=connection, name=metrics.worker, log_job_description=False,
                         queue_class=queue_class(self.taking), **kwargs)
        self.link = link   # connection (see redislink.connect) is patient; this one answers at once
        self.outbox = Outbox(link)
        self.engines = engines
        self.models = {name: {"n_ctx": e.n_ctx, "info": e.info, "max_token_bytes": _max_token_bytes(e.tokenizer),
                              "sampling_defaults": e.sampling_defaults}
                       for name, e in engines.items()}
        self.model_of = {q: name for name in engines for q in (protocol.queue_name(name),
                                                                protocol.batch_queue_name(name))}
        self.metrics = metrics
        self.metrics_port = metrics_port
        self.stream_ttl = stream_ttl
        self.last_tokens_per_second = 0.0
        self.running: dict[str, JobRun] = {}   # job id -> its run, from its start until RQ has filed it

    # RQ's own heartbeat would only come between jobs; ours comes from a thread every interval.
    # RQ gives up on a job well after our liveness key expires, so that fail_orphans, which
    # says why and marks the stream, normally gets there first.
    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        return 2 * self.liveness_ttl + int(self.interval)

    def work(self, *args, **kwargs) -> bool:
        # RQ installs its stop handlers only after its start-up round trips; until then a stop
        # would kill the worker uncleanly (in an outage the start-up waits for Redis)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._stop_while_starting)
        counter = TokenCounter(self.engines, self.connection)
        stop = threading.Event()
        beat = threading.Thread(target=self._beat, args=(stop,), name="vkllm-heartbeat", daemon=True)
        try:
            self._forget_dead_namesake()
            counter.start()   # before publish: the web app asks for counts once it sees the models
            self.publish(self.connection)
            self.fail_orphans(self.connection)
            beat.start()
            return super().work(*args, **kwargs)   # its loop's first turn ends on a stop noted before
        except UNAVAILABLE:
            if not self._stop_requested:
                raise
            log.info("worker %s stopped while starting, with Redis away", self.name)
            self.teardown()
            return False
        finally:
            stop.set()
            counter.stop()
            for thread in (beat, counter):   # either may not have started
                if thread.is_alive():
                    thread.join()
            try:
                self.link.delete(protocol.worker_key(self.name))
                self.taking.leave(self.link)
            except UNAVAILABLE:   # the key expires by itself; the watchdog gives back what was taken
                pass

    def _forget_dead_namesake(self) -> None:
        """RQ refuses to start under a name whose last holder never said goodbye (killed): its
        record lingers for minutes. That holder is dead once its liveness key is gone."""
        if not self.connection.exists(protocol.worker_key(self.name)) and \
                not self.connection.hexists(self.key, "death"):
            self.connection.delete(self.key)

    def _stop_while_starting(self, signum, frame):
        """A stop before RQ's loop is noted, not raised as RQ's handler does (an exception from a
        handler can strike anywhere, inside a held lock too); commands waiting for Redis give up."""
        self.connection.get_retry().update_retries(3)
        self._stop_requested = True

    def request_stop(self, signum, frame):
        """A stop ends the patience: from now on every Redis command (those waiting included) is
        tried a few times, not for ever, so that a stop during an outage ends. A first stop lets
        the running jobs finish (no job joins meanwhile); a second fails them (_abort)."""
        self.connection.get_retry().update_retries(3)
        super().request_stop(signum, frame)

    def subscribe(self):
        """RQ's command channel (its `rq:pubsub:` commands), read by a thread that waits at most
        PUBSUB_POLL seconds per read. RQ waits 60, and redis-py 8's stop() joins that thread: a
        stop whose unsubscribe reply lost the race with the thread's next read waited out the
        60 s (a warm shutdown that outlasted `docker stop`'s grace)."""
        self.log.info("Worker %s: subscribing to channel %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(
            sleep_time=PUBSUB_POLL, daemon=True, exception_handler=self._pubsub_exception_handler)

    def teardown(self):
        try:
            super().teardown()
        except UNAVAILABLE as e:
            log.warning("Redis unavailable at shutdown (%s); this worker's RQ record expires by itself", e)

    # -- the batch loop ----------------------------------------------------------------------------
    def execute_job(self, job, queue):
        """RQ hands over a job while this worker is idle: it starts the batch loop, which ends
        when no job is left."""
        token = _current_worker.set(self)
        try:
            self._start(job, queue)
            while self.running:
                self._take_queued()
                self._step()
        except Exception as e:   # a fault of the worker's own: its jobs fail, the worker goes on
            log.exception("the batch loop failed")
            self._abort(e)
        except BaseException as e:   # a shutdown (SystemExit) in the middle of the batch
            self._abort(e)
            raise
        finally:
            _current_worker.reset(token)
        self.set_state(WorkerStatus.IDLE)

    def prepare_execution(self, job: Job) -> Execution:
        """RQ's (an execution in the started registry, the worker busy), the job leaving the
        taking list in the same transaction: it is always in one of the two."""
        with self.connection.pipeline() as pipe:
            execution = Execution.create(job, self.get_heartbeat_ttl(job), pipeline=pipe, worker_name=self.name)
            self.set_state(WorkerStatus.BUSY, pipeline=pipe)
            self.taking.started(job.id, pipe)
            pipe.execute()
        self.executions[execution.id] = execution
        return execution

    def _start(self, job: Job, queue) -> None:
        """Start a job as RQ does (an execution in the started registry) and run its function,
        which joins the request to its model's batch; a bad request fails the job alone."""
        execution = self.prepare_execution(job)
        self.prepare_job_execution(job)   # RQ's intermediate queue is not used (taking.py)
        job.started_at = now()
        # for the watchdog (vkllm.orphans): how long to wait for this worker, and which start
        # of it runs the job (a worker restarted under the same name does not)
        job.meta |= {"liveness_ttl": self.liveness_ttl, "worker_instance": self.instance}
        job.save_meta()
        run = self.running[job.id] = JobRun(job, queue, execution)
        self.outbox.open(run.stream, orphans.stream_lifetime(job, self.stream_ttl))
        try:
            job.perform()
        except Exception as e:
            run.fail_now(e)
            self.outbox.send(run.stream, run.error_record())

    def join(self, job: Job, request: dict) -> None:
        self.running[job.id].join(self.engines, request)

    def _take_queued(self) -> None:
        """Jobs waiting in this worker's queues join while their model's batch has room; none
        while a stop is requested or Redis is away (the batch does not wait for it: the pop goes
        through the link, which fails at once, so an outage that begins after a step's round trip
        does not hold the next step until Redis is back)."""
        while not self._stop_requested and self.outbox.up:
            queues = [q for q in self._ordered_queues if self.engines[self.model_of[q.name]].batch.room()]
            if not queues:
                return
            try:
                taken = self._pop_first(queues)
            except UNAVAILABLE:
                return   # gone since the last step: that step's flush notices, and no job joins meanwhile
            if taken is None:
                return
            job, queue = taken
            self.log.info("Worker %s: %s: %s", self.name, queue.name, job.id)
            self._start(job, queue)

    def _pop_first(self, queues: list[Queue]) -> tuple[Job, Queue] | None:
        """The job at the front of the first non-empty queue, taken (taking.py), and its queue.
        The take goes through the link (raising UNAVAILABLE at once when Redis is away); a taken
        job is fetched through the patient connection, which does not give it up."""
        while True:
            taken = self.taking.take(queues, self.link)
            if taken is None:
                return None
            job = self.taking.fetch(self.connection, *taken, job_class=self.job_class, serializer=self.serializer,
                                    death_penalty_class=self.death_penalty_class)
            if job is not None:
                return job

    def _step(self) -> None:
        """One step of every model's batch, then one round trip for all the jobs; then the jobs
        that ended, and whose streams Redis has whole, are filed."""
        for model, engine in self.engines.items():
            batch = engine.batch
            if not len(batch):
                continue
            try:
                events = batch.step()
            except Exception as e:   # the engine failed the step: that batch's jobs fail, the worker goes on
                log.exception("a batch step of %s failed", model)
                for run in [r for r in self.running.values() if r.model == model and not r.ended]:
                    run.fail_now(e)
                    self.outbox.send(run.stream, run.error_record())
                    batch.cancel(run.seq)
                continue
            for seq, event in events:
                run = seq.tag
                if run.ended:   # failed while its sequence was still in the batch
                    continue
                for record in run.push(event):
                    self.outbox.send(run.stream, record)
                if event.finish_reason is None:
                    self.metrics.token(model)
            self.metrics.batch(model, batch.stats())
        self._sync()
        self._file_ended()
        if self.running and not any(len(e.batch) for e in self.engines.values()):
            self.outbox.pause()   # only ended jobs are left, their streams waiting for Redis

    def _sync(self) -> None:
        """The round trip of a step: the new stream records, every running job's cancel key, the
        progress of those due; a cancelled job (or one past its timeout) leaves the batch."""
        active = [run for run in self.running.values() if not run.ended]
        at = time.monotonic()
        for run in active:
            if not run.cancelling and run.job.timeout and 0 < run.job.timeout < at - run.started:
                run.timed_out = run.cancelling = True
                run.engine.batch.cancel(run.seq)
        due = [run for run in active if at - run.progress_at > PROGRESS_INTERVAL]

        def commands(pipe):
            for run in active:
                pipe.exists(run.cancel_key)
            for run in due:
                run.job.meta["progress"] = run.progress()
                pipe.hset(run.job.key, "meta", run.job.serializer.dumps(run.job.meta))
        replies = self.outbox.flush(commands)
        if replies is None:   # Redis is away: not cancelled, as far as we know
            return
        for run in due:
            run.progress_at = at
        for run, cancelled in zip(active, replies):
            if cancelled and not run.cancelling:
                run.cancelling = True
                run.engine.batch.cancel(run.seq)

    def _file_ended(self) -> None:
        for run in [r for r in self.running.values() if r.ended and not self.outbox.waiting(r.stream)]:
            self._file(run)

    def _file(self, run: JobRun) -> None:
        """File an ended job with RQ: finished (a cancelled one with the cancelled jobs) or failed."""
        del self.running[run.job.id]
        self.outbox.close(run.stream)
        job, queue = run.job, run.queue
        if run.model is not None:
            job.meta["progress"] = run.progress()
            job.save_meta()
            self.metrics.job_done(run.model, run.timings, time.monotonic() - run.started)
            self.last_tokens_per_second = run.timings.generation_tokens_per_second or self.last_tokens_per_second
        if run.exc_info is not None:
            self._finalize_failure(job, queue, run.execution, run.exc_info)
            return
        self._finalize_success(job, queue, run.execution, run.result)
        if run.finish == "cancelled":
            with self.connection.pipeline() as pipe:
                queue.finished_job_registry.remove(job, pipeline=pipe)
                job.set_status(JobStatus.CANCELED, pipeline=pipe)
                queue.canceled_job_registry.add(job, pipeline=pipe)
                pipe.execute()

    def _abort(self, error: BaseException) -> None:
        """Every job still running ends failed with this error, its partial output kept."""
        for run in self.running.values():
            if not run.ended:
                run.fail_now(error)
                self.outbox.send(run.stream, run.error_record())
                if run.seq is not None and isinstance(error, Exception):   # the worker goes on
                    run.engine.batch.cancel(run.seq)
        # a shutdown waits for Redis a little, not for ever
        self.outbox.drain(None if isinstance(error, Exception) else time.monotonic() + 5)
        for run in list(self.running.values()):
            try:
                self._file(run)
            except UNAVAILABLE as e:   # a shutdown while Redis is away: the watchdog fails the job
                log.error("job %s could not be filed (%s)", run.job.id, e)

    # -- the heartbeat thread ------------------------------------------------------------------------
    def _beat(self, stop: threading.Event) -> None:
        down = False
        while not stop.wait(self.interval):
            try:
                self.publish(self.link)   # at once: Redis away, or refusing writes (a full one answers PING)
                if down:
                    self._register_again()
                    down = False
                runs = list(self.running.values())
                if runs:
                    self.maintain_all_heartbeats(runs)
                self.fail_orphans(self.link)
            except UNAVAILABLE as e:
                if not down:
                    log.warning("Redis unavailable (%s); waiting for it", e)
                down = True
                self._stay_alive()
            except Exception:  # a Redis hiccup must not end the heartbeat for good
                log.exception("heartbeat failed")

    def _stay_alive(self) -> None:
        """While Redis refuses writes for want of memory (OOM), EXPIRE and DEL still go through
        (outside MULTI, which it refuses whole): this worker's liveness key lives on and the
        watchdog's notes that it looked gone go, so that no sweep that gets a write through while
        memory comes and goes takes this worker for dead. Down, or refusing every write (MISCONF),
        Redis takes no sweep's note either."""
        with self.link.pipeline(transaction=False) as pipe:
            pipe.expire(protocol.worker_key(self.name), self.liveness_ttl)
            self._forget_gone_notes(pipe, list(self.running))
            try:
                pipe.execute()
            except UNAVAILABLE:
                pass

    def maintain_all_heartbeats(self, runs: list[JobRun]) -> None:
        """RQ's maintain_heartbeats for all running jobs in one round trip: the worker's record,
        each execution (in the started registry) and each job."""
        worker_ttl = self.job_monitoring_interval + 60
        with self.link.pipeline() as pipe:   # at once: the heartbeat thread must not hang in a retry
            self.heartbeat(worker_ttl, pipeline=pipe)
            job_beats = []
            for run in runs:
                ttl = self.get_heartbeat_ttl(run.job)
                run.execution.heartbeat(run.job.started_job_registry, ttl, pipeline=pipe)
                job_beats.append((len(pipe), run.job))
                run.job.heartbeat(now(), ttl, pipeline=pipe, xx=True)
            results = pipe.execute()
            # as RQ's maintain_heartbeats: a job deleted meanwhile (result_ttl 0) must not come
            # back as a hash of one field, and a worker record that had expired is written whole
            for index, job in job_beats:
                if results[index] == 1:
                    pipe.delete(job.key)
            if results[0] == 1:
                pipe.hset(self.key, mapping=self.serialize())
                pipe.expire(self.key, worker_ttl)
            if len(pipe):
                pipe.execute()

    def _register_again(self) -> None:
        """After an outage: RQ's record of this worker is back with Redis's data, or made anew."""
        log.info("Redis is back; worker %s registers again", self.name)
        if not self.connection.exists(self.key):
            self.register_birth()

    def publish(self, client: Redis) -> None:
        """Tell the web app what this worker serves and runs; the key dies with the worker.
        `client`: the patient connection at start, the link (failing at once) in the heartbeat."""
        stats = {name: engine.stats() for name, engine in self.engines.items()}
        for name, device in stats.items():
            self.metrics.device_stats(name, device)
        key, jobs = protocol.worker_key(self.name), list(self.running)
        with client.pipeline() as pipe:
            pipe.hset(key, mapping={
                "name": self.name, "hostname": socket.gethostname(), "pid": os.getpid(),
                "models": json.dumps(self.models), "stats": json.dumps(stats),
                "metrics_port": self.metrics_port, "jobs": json.dumps(jobs),
                "tokens_per_second": self.last_tokens_per_second, "instance": self.instance,
            })
            pipe.expire(key, self.liveness_ttl)
            pipe.sadd(protocol.WORKERS, self.name)
            pipe.hset(protocol.MODELS, mapping={name: json.dumps(m) for name, m in self.models.items()})
            self.taking.register(pipe)
            self._forget_gone_notes(pipe, jobs)
            pipe.execute()

    def _forget_gone_notes(self, pipe, jobs: list[str]) -> None:
        """Deletes the watchdog's notes (vkllm.orphans) that this worker looked gone, made by a
        sweep after a Redis restart or while it refused writes: alive, no sweep may count its
        running `jobs` as orphaned, nor give back what it took."""
        pipe.delete(protocol.taker_gone_key(self.instance), *map(protocol.orphan_key, jobs))

    def fail_orphans(self, client: Redis) -> None:
        """Fail started jobs of this worker's models whose worker died, and put back in their
        queue the jobs dead workers took and never started (vkllm.orphans). `client`: the patient
        connection at start, the link in the heartbeat, which must not hang in the patient one's
        endless retry (Redis full: then its EXPIRE keeps this worker alive, _stay_alive)."""
        orphans.reap([Queue(q.name, connection=client) for q in self.queues], self.stream_ttl)
        orphans.requeue_taken(client)


def _max_token_bytes(tokenizer) -> int:
    """The longest token in bytes: with it the web app, which has no tokenizer, can refuse a
    prompt that cannot fit the context whatever it tokenizes to."""
    return max(len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size))
