"""The web side's only door to Redis and RQ: submitting, reading, listing and cancelling jobs,
reading job streams and what the live workers serve, and asking them for token counts."""
import json
import time
import uuid

from flask import current_app
from redis import Redis
from rq import Queue
from rq.job import Job, JobStatus

from appliance import protocol

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


def init_app(app) -> None:
    # the socket timeout must outlast a blocking stream read (redis-py's default does not)
    app.extensions["vkllm_redis"] = Redis.from_url(app.config["REDIS_URL"], socket_timeout=FOLLOW_BLOCK_MS / 1000 + 25)


def get_redis() -> Redis:
    return current_app.extensions["vkllm_redis"]


def live_workers() -> list[dict]:
    """Workers whose key is still alive, with their models and device stats decoded."""
    r, workers = get_redis(), []
    for name in sorted(m.decode() for m in r.smembers(protocol.WORKERS)):
        raw = r.hgetall(protocol.worker_key(name))
        if not raw:
            r.srem(protocol.WORKERS, name)
            continue
        w = {k.decode(): v.decode() for k, v in raw.items()}
        w["models"], w["stats"] = json.loads(w["models"]), json.loads(w["stats"])
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


def count_tokens(model: str, prompt: str | None = None, messages: list[dict] | None = None,
                 timeout: float = TOKENIZE_TIMEOUT) -> int | None:
    """The prompt's (or chat's) length in tokens, counted by a worker serving `model`; None when
    none answered within `timeout` seconds (the worker then checks the length when it runs the job).
    Raises ValueError with the worker's words when the model's chat template refuses the messages."""
    r, reply = get_redis(), protocol.tokenize_reply_key(uuid.uuid4().hex)
    key = protocol.tokenize_key(model)
    ask = {"reply": reply} | ({"messages": messages} if messages is not None else {"prompt": prompt})
    with r.pipeline() as pipe:
        pipe.rpush(key, json.dumps(ask))
        pipe.expire(key, int(timeout) + 1)   # requests nobody took in time go with the list
        pipe.execute()
    answered = r.blpop([reply], timeout=timeout)
    if answered is None:
        return None
    answer = json.loads(answered[1])
    if "error" in answer:
        raise ValueError(answer["error"])
    return answer["tokens"]


def _queue(model: str) -> Queue:
    return Queue(protocol.queue_name(model), connection=get_redis())


def submit(request: dict, *, priority: str, metadata: dict, kind: str) -> tuple[str, int]:
    """Enqueue a generation; returns the job id and its 0-based position in the model's queue."""
    cfg = current_app.config
    queue = _queue(request["model"])
    job = queue.enqueue_call(
        protocol.JOB_FUNCTION, kwargs={"request": request}, at_front=priority == "high",
        timeout=cfg["JOB_TIMEOUT"], result_ttl=cfg["RESULT_TTL"], failure_ttl=cfg["RESULT_TTL"],
        meta={"model": request["model"], "metadata": metadata, "kind": kind, "priority": priority,
              "progress": {"tokens": 0, "max_tokens": request["params"]["max_tokens"]}})
    get_redis().zadd(protocol.JOBS, {job.id: time.time()})
    return job.id, queue.get_job_position(job.id) or 0


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
        found = r.xread({key: "0-0" if after == "-" else after}, block=block_ms, count=256)
        entries = found[0][1] if found else []
    return [(eid.decode(), *protocol.parse(fields)) for eid, fields in entries]


def follow(job_id: str, after: str = "-", block_ms: int = FOLLOW_BLOCK_MS):
    """Yield the job's stream records from `after` on until its end or error record; yield None
    every block_ms without news (for keep-alives). A job that ended without writing a last record
    (cancelled before it ran, or failed by RQ's own cleanup) gets one made up from its state."""
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


def describe(job: Job) -> dict:
    """Everything GET /api/v1/jobs/<id> shows: state, progress, position, output so far, error."""
    records = stream_records(job.id)
    text = "".join(d["text"] for _, kind, d in records if kind == protocol.TOKEN)
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
        "ended_at": job.ended_at.timestamp() if job.ended_at else None,
        "params": asked(job).get("params"),
        "output": text, "finish_reason": end.get("finish_reason") if end else None,
        "usage": end.get("usage") if end else None, "timings": end.get("timings") if end else None,
        "error": error,
    }


def asked(job: Job) -> dict:
    """The request the job runs: model, prompt or messages, and the sampling parameters as
    applied (defaults filled in when it was queued)."""
    return job.kwargs.get("request") or {}


def _failure_reason(job: Job) -> str:
    """The last line of the failure, in words when RQ failed it because its worker vanished."""
    result = job.latest_result()
    text = result.exc_string.strip() if result and result.exc_string else "failed"
    if "AbandonedJobError" in text:
        return "the worker running this job stopped; the text generated before that is kept"
    return text.splitlines()[-1]


def list_jobs(state_filter: str | None, offset: int, limit: int) -> tuple[list[dict], int]:
    """Newest first; jobs whose records expired are dropped from the index on the way."""
    r = get_redis()
    ids = [i.decode() for i in r.zrevrange(protocol.JOBS, 0, -1)]
    jobs = Job.fetch_many(ids, connection=r)
    gone = [i for i, j in zip(ids, jobs) if j is None]
    if gone:
        r.zrem(protocol.JOBS, *gone)
    matching = [j for j in jobs if j is not None and (state_filter is None or state(j) == state_filter)]
    return [describe(j) for j in matching[offset:offset + limit]], len(matching)


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
    return {name: q.count for name, q in _model_queues().items()}


def job_counts() -> dict[str, int]:
    """Jobs by state across the model queues, from RQ's registries."""
    counts = dict.fromkeys(("queued", "running", "finished", "failed", "cancelled"), 0)
    for q in _model_queues().values():
        counts["queued"] += q.count
        counts["running"] += q.started_job_registry.count
        counts["finished"] += q.finished_job_registry.count
        counts["failed"] += q.failed_job_registry.count
        counts["cancelled"] += q.canceled_job_registry.count
    return counts
