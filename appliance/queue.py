"""The web side's only door to Redis and RQ: submitting, reading, listing and cancelling jobs,
reading job streams and what the live workers serve, and asking them for token counts.

While Redis is unreachable, or refuses writes (vkllm.outage), its commands raise one of UNAVAILABLE
after a few quick retries; the app answers those with 503 (app.py), and a stream being followed
waits for Redis a while."""
import json
import time
import uuid

from flask import current_app
from redis import Redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError
from redis.retry import Retry
from rq import Queue
from rq.job import Job, JobStatus
from rq.utils import now, utcformat

from vkllm import orphans, protocol
from vkllm.jobqueue import JobQueue
from vkllm.outage import CLIENT_OPTIONS, UNAVAILABLE

# RQ's statuses as users see them. The worker files a generation stopped by cancellation as
# CANCELED right after RQ marks it FINISHED; describe() goes by the stream's end record meanwhile.
STATES = {
    JobStatus.QUEUED: "queued", JobStatus.DEFERRED: "queued", JobStatus.SCHEDULED: "queued",
    JobStatus.STARTED: "running", JobStatus.FINISHED: "finished", JobStatus.FAILED: "failed",
    JobStatus.STOPPED: "cancelled", JobStatus.CANCELED: "cancelled",
}
TERMINAL = {"finished", "failed", "cancelled"}


FOLLOW_BLOCK_MS = 5000   # how long a stream read waits for news before a keep-alive
TOKENIZE_TIMEOUT = 2.0   # seconds a submit waits for a worker to count its prompt's tokens
COMMAND_TIMEOUT = TOKENIZE_TIMEOUT + 3   # seconds a command may take before Redis counts as unavailable


def init_app(app) -> None:
    # A request gives up on a refused connection within a second (redis-py's default: several)
    # and on a Redis that answers nothing (paused, its host gone) after one command's timeout:
    # timeouts are not retried. Blocking stream reads take a client of their own, whose
    # timeout outlasts their block.
    def client(socket_timeout: float) -> Redis:
        return Redis.from_url(app.config["REDIS_URL"], socket_timeout=socket_timeout, socket_connect_timeout=2,
                              retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 3,
                                          supported_errors=(ConnectionError,)), **CLIENT_OPTIONS)
    app.extensions["vkllm_redis"] = client(COMMAND_TIMEOUT)
    app.extensions["vkllm_redis_follow"] = client(FOLLOW_BLOCK_MS / 1000 + 25)


def get_redis() -> Redis:
    return current_app.extensions["vkllm_redis"]


def live_workers() -> list[dict]:
    """Workers whose key is still alive, with their models, device stats and running jobs decoded."""
    r, workers = get_redis(), []
    for name in sorted(m.decode() for m in r.smembers(protocol.WORKERS)):
        raw = r.hgetall(protocol.worker_key(name))
        if not raw:
            r.srem(protocol.WORKERS, name)
            continue
        w = {k.decode(): v.decode() for k, v in raw.items()}
        w["models"], w["stats"], w["jobs"] = json.loads(w["models"]), json.loads(w["stats"]), json.loads(w["jobs"])
        w["tokens_per_second"] = float(w["tokens_per_second"])
        workers.append(w)
    return workers


def models() -> dict[str, dict]:
    """Every model some live worker serves: name -> n_ctx, info, max_token_bytes, workers."""
    found = {}
    for w in live_workers():
        for name, m in w["models"].items():
            entry = found.setdefault(name, m | {"name": name, "workers": []})
            entry["workers"].append(w["name"])
    return found


def model_info(name: str) -> dict | None:
    """A model some live worker serves, or one a worker served before (its jobs wait for a worker
    to come back; "workers" is empty then); None for a model this appliance never served."""
    served = models()
    if name in served:
        return served[name]
    known = get_redis().hget(protocol.MODELS, name)
    return json.loads(known) | {"name": name, "workers": []} if known else None


def count_tokens(model: str, prompt: str | None = None, messages: list[dict] | None = None,
                 tools: list[dict] | None = None, constraint: dict | None = None,
                 timeout: float = TOKENIZE_TIMEOUT) -> int | None:
    """The prompt's (or chat's) length in tokens, counted by a worker serving `model`; None when
    none answered within `timeout` seconds (the worker then checks the length when it runs the job).
    Raises ValueError with the worker's words when the model's chat template refuses the messages,
    or (its second argument "constraint") when the worker cannot enforce the constraint."""
    r, reply = get_redis(), protocol.tokenize_reply_key(uuid.uuid4().hex)
    key = protocol.tokenize_key(model)
    ask = {"reply": reply} | ({"messages": messages} if messages is not None else {"prompt": prompt}) \
        | ({"tools": tools} if tools else {}) | ({"constraint": constraint} if constraint else {})
    with r.pipeline() as pipe:
        pipe.rpush(key, json.dumps(ask))
        pipe.expire(key, int(timeout) + 1)   # requests nobody took in time go with the list
        pipe.execute()
    answered = r.blpop([reply], timeout=timeout)
    if answered is None:
        return None
    answer = json.loads(answered[1])
    if "error" in answer:
        raise ValueError(answer["error"], *([answer["param"]] if "param" in answer else []))
    return answer["tokens"]


def _queue(model: str) -> JobQueue:
    return JobQueue(protocol.queue_name(model), connection=get_redis())


def submit(request: dict, *, priority: str, metadata: dict, kind: str) -> tuple[str, int]:
    """Enqueue a generation; returns the job id and its 0-based position in the model's queue."""
    cfg = current_app.config
    queue = _queue(request["model"])
    job = queue.enqueue_call(
        protocol.JOB_FUNCTION, kwargs={"request": request}, at_front=priority == "high",
        description=f"generation ({request['model']})",   # RQ's default, the arguments, shows the prompt
        timeout=cfg["JOB_TIMEOUT"], result_ttl=cfg["RESULT_TTL"], failure_ttl=cfg["RESULT_TTL"],
        meta={"model": request["model"], "metadata": metadata, "kind": kind, "priority": priority,
              "progress": {"tokens": 0, "max_tokens": request["params"]["max_tokens"]}})
    get_redis().zadd(protocol.JOBS, {job.id: time.time()})
    return job.id, queue.get_job_position(job.id) or 0


def submit_batch(lines: list[tuple[str, dict, dict]]) -> None:
    """Enqueue batch lines, (job id, request, metadata) each, at the back of their models' batch
    queues (protocol.batch_queue_name), which workers take from only when no interactive job waits.
    Kept out of the job listing: a batch is listed as one."""
    cfg, r, jobs = current_app.config, get_redis(), {}
    for job_id, request, metadata in lines:
        jobs.setdefault(request["model"], []).append(Queue.prepare_data(
            protocol.JOB_FUNCTION, kwargs={"request": request}, job_id=job_id,
            description=f"batch line ({request['model']})", timeout=cfg["JOB_TIMEOUT"],
            result_ttl=cfg["RESULT_TTL"], failure_ttl=cfg["RESULT_TTL"],
            meta={"model": request["model"], "metadata": metadata, "kind": "batch", "priority": "batch",
                  "progress": {"tokens": 0, "max_tokens": request["params"]["max_tokens"]}}))
    with r.pipeline() as pipe:
        for model, datas in jobs.items():
            JobQueue(protocol.batch_queue_name(model), connection=r).enqueue_many(datas, pipeline=pipe)
        pipe.execute()


def states(job_ids: list[str]) -> list[str | None]:
    """Each job's state as users see it (STATES); None for a job that does not exist (any more)."""
    with get_redis().pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hget(Job.key_for(job_id), "status")
        raw = pipe.execute()
    return [None if s is None else STATES.get(s.decode(), "queued") for s in raw]


def fetch_many(job_ids: list[str]) -> list[Job | None]:
    return Job.fetch_many(job_ids, connection=get_redis())


def reap_batch_queues(models: set[str]) -> None:
    """Fail the batch lines whose worker died (vkllm.orphans), also when no worker of them is left."""
    r = get_redis()
    orphans.reap([Queue(protocol.batch_queue_name(m), connection=r) for m in models], current_app.config["RESULT_TTL"])


def batch_queue_length(model: str) -> int:
    return Queue(protocol.batch_queue_name(model), connection=get_redis()).count


def queue_length(model: str) -> int:
    return _queue(model).count


def last_event(job_id: str) -> tuple[tuple[int, int], bool] | None:
    """The id of the job stream's last entry as (milliseconds, sequence), and whether that entry
    ends the stream (an end or error record); None when it has none."""
    last = get_redis().xrevrange(protocol.stream_key(job_id), count=1)
    if not last:
        return None
    eid, fields = last[0]
    return tuple(int(part) for part in eid.decode().split("-")), protocol.parse(fields)[0] in (protocol.END,
                                                                                                protocol.ERROR)


def fetch(job_id: str) -> Job | None:
    return Job.fetch(job_id, connection=get_redis()) if Job.exists(job_id, get_redis()) else None


def state(job: Job) -> str:
    return STATES.get(job.get_status(refresh=False), "queued")


def stream_records(job_id: str, after: str = "-", block_ms: int | None = None) -> list[tuple[str, str, dict]]:
    """Records of the job's stream after entry id `after` ("-": from the start), optionally
    waiting up to block_ms for new ones."""
    key, r = protocol.stream_key(job_id), get_redis()
    if block_ms is None:
        start = "-" if after == "-" else f"({after}"
        entries = r.xrange(key, min=start)
    else:
        found = current_app.extensions["vkllm_redis_follow"].xread({key: "0-0" if after == "-" else after},
                                                                   block=block_ms, count=256)
        entries = found[0][1] if found else []
    return [(eid.decode(), *protocol.parse(fields)) for eid, fields in entries]


def follow(job_id: str, after: str = "-", block_ms: int = FOLLOW_BLOCK_MS):
    """Yield the job's stream records from `after` on until its end or error record; yield None
    every block_ms without news (for keep-alives). A job that ended without writing a last record
    (cancelled before it ran, or failed by RQ's own cleanup) gets one made up from its state.
    While Redis is unreachable: keep-alives for up to REDIS_OUTAGE_WAIT seconds, then an error
    record (kind "unavailable"), so that a reader is told, never cut off."""
    patience, down_since = current_app.config["REDIS_OUTAGE_WAIT"], None
    while True:
        try:
            for record in _follow(job_id, after, block_ms):
                down_since = None
                if record is not None:
                    after = record[0]
                yield record
            return
        except UNAVAILABLE:
            down_since = down_since or time.monotonic()
            if time.monotonic() - down_since >= patience:
                yield (after, protocol.ERROR, {
                    "error": "the job queue (Redis) is unreachable; the job goes on if it can: read it again "
                             "later (Last-Event-ID resumes the stream)", "kind": "unavailable"})
                return
            yield None
            time.sleep(1)


def _follow(job_id: str, after: str, block_ms: int):
    while True:
        records = stream_records(job_id, after, block_ms)
        for record in records:
            yield record
            after = record[0]
            if record[1] in (protocol.END, protocol.ERROR):
                return
        if records:
            continue
        job = fetch(job_id)
        if job:
            _settle(job)
        st = state(job) if job else "failed"
        if st in TERMINAL:
            # records written between the blocking read and the state check come first
            rest = stream_records(job_id, after)
            yield from rest
            tail = rest[-1:] or [(eid, *protocol.parse(f)) for eid, f in
                                 get_redis().xrevrange(protocol.stream_key(job_id), count=1)]
            if not (tail and tail[0][1] in (protocol.END, protocol.ERROR)):
                yield (after, protocol.END, {"finish_reason": "cancelled", "usage": None, "timings": None}) \
                    if st == "cancelled" else (after, protocol.ERROR, {
                        "error": describe(job)["error"] if job else "the job expired", "kind": "server_error"})
            return
        yield None


def _settle(job: Job) -> None:
    """A running job whose worker died is failed when it is read (vkllm.orphans), also when
    no worker of its model is left to do it."""
    if state(job) == "running" and orphans.reap([Queue(job.origin, connection=get_redis())],
                                                current_app.config["RESULT_TTL"]):
        job.refresh()


def describe(job: Job, with_output: bool = True) -> dict:
    """Everything GET /api/v1/jobs/<id> shows: state, progress, position, output so far, error.
    Without the output (listings), only the stream's last record is read, and output is None.
    A running job whose worker died is failed first (_settle)."""
    _settle(job)
    if with_output:
        records = stream_records(job.id)
        text = "".join(d["text"] for _, kind, d in records if kind == protocol.TOKEN)
    else:
        records = [(eid.decode(), *protocol.parse(f))
                   for eid, f in get_redis().xrevrange(protocol.stream_key(job.id), count=1)]
        text = None
    end = next((d for _, k, d in records if k == protocol.END), None)
    error = next((d["error"] for _, k, d in records if k == protocol.ERROR), None)
    st = "cancelled" if end and end.get("finish_reason") == "cancelled" else state(job)
    if st == "failed" and error is None:
        error = _failure_reason(job)
    return {
        "id": job.id, "object": "job", "state": st, "model": job.meta.get("model"),
        "kind": job.meta.get("kind"), "priority": job.meta.get("priority"), "metadata": job.meta.get("metadata"),
        "progress": job.meta.get("progress"),
        "queue_position": _queue(job.meta["model"]).get_job_position(job.id) if st == "queued" else None,
        "created_at": job.created_at.timestamp() if job.created_at else None,
        "started_at": job.started_at.timestamp() if job.started_at else None,
        "ended_at": _ended_at(job, st),
        "params": asked(job).get("params"),
        "output": text, "finish_reason": end.get("finish_reason") if end else None,
        "usage": end.get("usage") if end else None, "timings": end.get("timings") if end else None,
        "error": error,
    }


def _ended_at(job: Job, st: str) -> float | None:
    """When the job ended. RQ fails a job whose worker died (vkllm.orphans) without setting its
    ended_at: that job ended when its failure was recorded."""
    if job.ended_at:
        return job.ended_at.timestamp()
    result = job.latest_result() if st == "failed" else None
    return result.created_at.timestamp() if result else None


def asked(job: Job) -> dict:
    """The request the job runs: model, prompt or messages, and the sampling parameters as
    applied (defaults filled in when it was queued)."""
    return job.kwargs.get("request") or {}


def _failure_reason(job: Job) -> str:
    """The last line of the failure, in words when RQ failed it because its worker vanished (as
    vkllm.orphans words it: RQ's own registry cleanup may fail such a job before the sweep does)."""
    result = job.latest_result()
    text = result.exc_string.strip() if result and result.exc_string else "failed"
    if "AbandonedJobError" in text:
        owner = f" ({job.worker_name})" if job.worker_name else ""
        return f"the worker running this job{owner} stopped; the text generated before that is kept"
    return text.splitlines()[-1]


LIST_CHUNK = 500   # job ids whose status a filtered listing reads per Redis round trip


def list_jobs(state_filter: str | None, offset: int, limit: int) -> tuple[list[dict], int]:
    """Newest first, from the index of submit times: only the page's jobs are read (without their
    output), and a state filter reads no more than each job's status field. Jobs whose records
    expired are dropped from the index on the way."""
    r = get_redis()
    if state_filter is None:
        ids = [i.decode() for i in r.zrevrange(protocol.JOBS, offset, offset + limit - 1)]
        total = r.zcard(protocol.JOBS)
    else:
        ids, total = _ids_in_state(r, state_filter, offset, limit)
    jobs = Job.fetch_many(ids, connection=r)
    gone = [i for i, j in zip(ids, jobs) if j is None]
    if gone:
        r.zrem(protocol.JOBS, *gone)
    return [describe(j, with_output=False) for j in jobs if j is not None], total - len(gone)


def _ids_in_state(r: Redis, wanted: str, offset: int, limit: int) -> tuple[list[str], int]:
    """The ids of the page's jobs in state `wanted`, and how many there are in all."""
    page, total, start = [], 0, 0
    while ids := [i.decode() for i in r.zrevrange(protocol.JOBS, start, start + LIST_CHUNK - 1)]:
        start += LIST_CHUNK
        with r.pipeline() as pipe:
            for job_id in ids:
                pipe.hget(Job.key_for(job_id), "status")
            statuses = pipe.execute()
        gone = [i for i, s in zip(ids, statuses) if s is None]
        if gone:
            r.zrem(protocol.JOBS, *gone)
            start -= len(gone)
        for job_id, status in zip(ids, statuses):
            if status is not None and STATES.get(status.decode(), "queued") == wanted:
                if offset <= total < offset + limit:
                    page.append(job_id)
                total += 1
    return page, total


def cancel(job: Job) -> str:
    """Queued jobs leave the queue at once; running ones stop at the worker's next token."""
    r = get_redis()
    st = state(job)
    if st in TERMINAL:
        return st
    # set in both cases: a worker may take a queued job between this check and the cancel
    r.set(protocol.cancel_key(job.id), 1, ex=current_app.config["RESULT_TTL"])
    if st == "queued":
        job.cancel()
        r.hset(job.key, "ended_at", utcformat(now()))   # RQ's cancel leaves it unset
        key = protocol.stream_key(job.id)
        r.xadd(key, protocol.record(protocol.END, finish_reason="cancelled", usage=None, timings=None))
        r.expire(key, current_app.config["RESULT_TTL"])
        return "cancelled"
    return st


def _model_queues() -> dict[str, Queue]:
    """Every model queue RQ knows, served now or not (jobs may wait for a worker to come back)."""
    prefix = protocol.queue_name("")
    return {q.name.removeprefix(prefix): q for q in Queue.all(connection=get_redis()) if q.name.startswith(prefix)}


def queue_depths() -> dict[str, int]:
    """Jobs waiting per model: every model a worker serves or served (0 before its first job,
    which is when RQ first lists its queue) and every queue RQ knows."""
    known = dict.fromkeys(sorted(m.decode() for m in get_redis().hkeys(protocol.MODELS)), 0)
    return known | {name: q.count for name, q in _model_queues().items()}


def job_counts() -> dict[str, int]:
    """Jobs by state across the model queues, from RQ's registries. Orphaned jobs are failed
    first: Prometheus's scrapes make this the watchdog's clock when no one reads jobs."""
    queues = _model_queues()
    orphans.reap(list(queues.values()), current_app.config["RESULT_TTL"])
    counts = dict.fromkeys(("queued", "running", "finished", "failed", "cancelled"), 0)
    for q in queues.values():
        counts["queued"] += q.count
        counts["running"] += q.started_job_registry.count
        counts["finished"] += q.finished_job_registry.count
        counts["failed"] += q.failed_job_registry.count
        counts["cancelled"] += q.canceled_job_registry.count
    return counts
