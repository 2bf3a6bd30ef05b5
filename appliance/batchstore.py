"""Batches (OpenAI's Batch API) on the job queue: each input line becomes a job on its model's
batch queue; the batch's fields live in Redis (protocol.batch_key), its files on the data volume.

A batch moves on in steps, each done by whichever web process holds the batch's lock: validating
(the input file read, each line checked as its endpoint checks a request and queued, resumable
line by line), cancelling the jobs of a cancelled or expired batch, and finalizing (the output and
error files written once no job of it is left to run). Any read of a batch that finds such a step
due starts it in a thread, and every web process sweeps the open batches every
BATCH_SWEEP_INTERVAL seconds, so no step depends on one process staying up.

Request counts follow the jobs: completed (finished), failed (refused lines, failed jobs); lines
cancelled or expired count as neither, as in OpenAI's."""
import json
import threading
import time
import uuid

from flask import current_app
from redis import Redis
from redis.exceptions import WatchError

from appliance import filestore, openai_api, queue
from appliance.batchlines import Line, read_lines, result_lines
from appliance.schema import Invalid
from vkllm import protocol

TERMINAL = ("completed", "failed", "cancelled", "expired")
ENDPOINTS = {"/v1/chat/completions": True, "/v1/completions": False}   # endpoint -> whether chat
WINDOWS = {"24h": 24 * 3600}
INTERNAL = ("lines", "stop", "models")   # fields kept with a batch that OpenAI's object does not have
LOCK_TTL = 60     # seconds a step holds a batch unless it goes on (each chunk renews it)
CHUNK = 500       # lines per round trip when queueing or reading jobs
MAX_ERRORS = 100  # validation errors reported of a file that cannot be run
STALE_UNLOCK = """if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"""


def _r() -> Redis:
    return queue.get_redis()


def load(batch_id: str) -> dict | None:
    raw = _r().hgetall(protocol.batch_key(batch_id))
    return {k.decode(): json.loads(v) for k, v in raw.items()} or None


def _put(pipe, batch_id: str, **fields) -> None:
    pipe.hset(protocol.batch_key(batch_id), mapping={k: json.dumps(v) for k, v in fields.items()})


def create(input_file_id: str, endpoint: str, window: str, metadata: dict | None) -> dict:
    now = int(time.time())
    batch = {"id": f"batch_{uuid.uuid4().hex}", "object": "batch", "endpoint": endpoint, "errors": None,
             "input_file_id": input_file_id, "completion_window": window, "status": "validating",
             "output_file_id": None, "error_file_id": None, "created_at": now, "in_progress_at": None,
             "expires_at": now + WINDOWS[window], "finalizing_at": None, "completed_at": None, "failed_at": None,
             "expired_at": None, "cancelling_at": None, "cancelled_at": None,
             "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": metadata, "model": None,
             "lines": None, "stop": None}
    with _r().pipeline() as pipe:
        _put(pipe, batch["id"], **batch)
        pipe.zadd(protocol.BATCHES, {batch["id"]: time.time()})
        pipe.zadd(protocol.OPEN_BATCHES, {batch["id"]: time.time()})
        pipe.execute()
    return view(batch)


def _transition(batch_id: str, sources: tuple[str, ...], status: str, **fields) -> bool:
    """Set the status (and fields) only if it is one of `sources` now: steps and cancel requests
    of several processes may race, and the first one wins."""
    r, key = _r(), protocol.batch_key(batch_id)
    with r.pipeline() as pipe:
        pipe.watch(key)
        now = pipe.hget(key, "status")
        if now is None or json.loads(now) not in sources:
            return False
        pipe.multi()
        _put(pipe, batch_id, status=status, **fields)
        if status in TERMINAL:
            pipe.zrem(protocol.OPEN_BATCHES, batch_id)
        try:
            pipe.execute()
        except WatchError:   # changed meanwhile; the caller reads the batch again
            return False
    return True


def view(batch: dict, counts: dict | None = None) -> dict:
    """The batch as OpenAI's API shows it."""
    shown = {k: v for k, v in batch.items() if k not in INTERNAL}
    return shown | ({"request_counts": counts} if counts else {})


def tally(batch: dict) -> tuple[dict, int]:
    """Request counts from the jobs now, and how many lines still wait or run."""
    r, lines = _r(), batch["lines"]
    if lines is None:
        return batch["request_counts"], 1
    rejected = {int(i) for i in r.hkeys(protocol.batch_rejected_key(batch["id"]))}
    completed, failed, pending = 0, len(rejected), 0
    numbers = [i for i in range(lines) if i not in rejected]
    for start in range(0, len(numbers), CHUNK):
        ids = [protocol.batch_job_id(batch["id"], i) for i in numbers[start:start + CHUNK]]
        for st in queue.states(ids):
            if st == "finished":
                completed += 1
            elif st == "failed":
                failed += 1
            elif st in ("queued", "running") or (st is None and batch["status"] == "validating"):
                pending += 1
            elif st is None and not batch["stop"]:   # its record expired: nothing to report of it
                failed += 1
    return {"total": lines, "completed": completed, "failed": failed}, pending


def current(batch_id: str) -> dict | None:
    """The batch with live counts; a step that is due is started in the background."""
    batch = load(batch_id)
    if batch is None:
        return None
    if batch["status"] in TERMINAL:
        return view(batch)
    queue.reap_batch_queues(_models(batch))   # lines whose worker died end failed, workers or not
    counts, pending = tally(batch)
    if pending == 0 or batch["status"] == "validating" or batch["stop"] or time.time() >= batch["expires_at"]:
        kick(batch_id)
    return view(batch, counts)


def cancel(batch_id: str) -> dict | None:
    if load(batch_id) is None:
        return None
    _transition(batch_id, ("validating", "in_progress"), "cancelling", cancelling_at=int(time.time()),
                stop="cancelled")
    kick(batch_id)
    return current(batch_id)


def listing(after: str | None, limit: int) -> tuple[list[dict], bool]:
    """Newest first, the page after batch id `after`; whether more follow."""
    r = _r()
    start = 0
    if after:
        rank = r.zrevrank(protocol.BATCHES, after)
        start = 0 if rank is None else rank + 1
    ids = [i.decode() for i in r.zrevrange(protocol.BATCHES, start, start + limit)]
    return [b for b in (current(i) for i in ids[:limit]) if b], len(ids) > limit


# --- the steps, under the batch's lock ---


def kick(batch_id: str) -> bool:
    """Start the batch's next step in a thread unless some process is at it already."""
    token = uuid.uuid4().hex
    if not _r().set(protocol.batch_lock_key(batch_id), token, nx=True, ex=LOCK_TTL):
        return False
    app = current_app._get_current_object()
    threading.Thread(target=_advance_locked, args=(app, batch_id, token), name=f"vkllm-{batch_id}",
                     daemon=True).start()
    return True


def _advance_locked(app, batch_id: str, token: str) -> None:
    with app.app_context():
        try:
            advance(batch_id)
        except Exception:
            app.logger.exception("batch %s: step failed; the sweep tries again", batch_id)
        finally:
            _r().eval(STALE_UNLOCK, 1, protocol.batch_lock_key(batch_id), token)


def _renew(batch_id: str) -> None:
    _r().expire(protocol.batch_lock_key(batch_id), LOCK_TTL)


def advance(batch_id: str) -> None:
    """Do what the batch needs next: validate and queue, stop its jobs, finalize."""
    batch = load(batch_id)
    if batch is None or batch["status"] in TERMINAL:
        return
    if batch["status"] == "validating":
        _validate(batch)
        batch = load(batch_id)
    if batch["status"] in TERMINAL or batch["status"] == "validating":
        return
    if not batch["stop"] and time.time() >= batch["expires_at"]:
        _put(_r(), batch_id, stop="expired")
        batch["stop"] = "expired"
    if batch["stop"]:
        _stop_jobs(batch)
    queue.reap_batch_queues(_models(batch))
    counts, pending = tally(batch)
    _put(_r(), batch_id, request_counts=counts)
    if pending == 0:
        _finalize(batch, counts)


def _models(batch: dict) -> set[str]:
    return set(batch.get("models") or ())


def _fail(batch: dict, errors: list[dict]) -> None:
    _transition(batch["id"], ("validating",), "failed", failed_at=int(time.time()),
                errors={"object": "list", "data": errors[:MAX_ERRORS]})


def _validate(batch: dict) -> None:
    """Check the input file as a whole (a malformed file fails the batch, as in OpenAI's), then
    each request as its endpoint does (a refused one goes to the error file) and queue it."""
    lines, errors = read_lines(batch, current_app.config["MAX_BATCH_LINES"])
    if errors:
        _fail(batch, errors)
        return
    r, batch_id = _r(), batch["id"]
    models = sorted({line.model for line in lines if line.model})
    _put(r, batch_id, lines=len(lines), models=models, model=models[0] if len(models) == 1 else None,
         request_counts={"total": len(lines), "completed": 0, "failed": 0})
    batch |= {"lines": len(lines), "models": models}
    for start in range(0, len(lines), CHUNK):
        _renew(batch_id)
        if json.loads(r.hget(protocol.batch_key(batch_id), "status")) != "validating":
            return   # cancelled meanwhile: the lines not queued yet never will be
        chunk = lines[start:start + CHUNK]
        ids = [protocol.batch_job_id(batch_id, line.number) for line in chunk]
        done = {int(i) for i in r.hkeys(protocol.batch_rejected_key(batch_id))}
        exists = [s is not None for s in queue.states(ids)]
        todo = [line for line, there in zip(chunk, exists) if not there and line.number not in done]
        queue.submit_batch(_checked(batch, todo))
    _transition(batch_id, ("validating",), "in_progress", in_progress_at=int(time.time()))


def _checked(batch: dict, lines: list[Line]) -> list[tuple[str, dict, dict]]:
    """The lines' generations to queue; those their endpoint refuses go to the error file now."""
    chat, queued, refused = ENDPOINTS[batch["endpoint"]], [], {}
    for line in lines:
        job_id = protocol.batch_job_id(batch["id"], line.number)
        try:
            _, gen = openai_api.parse(line.body, chat)
        except Invalid as e:
            refused[line.number] = json.dumps({
                "id": f"batch_req_{job_id}", "custom_id": line.custom_id,
                "response": {"status_code": e.status, "request_id": job_id, "body": e.body()}, "error": None})
            continue
        queued.append((job_id, gen, {"batch": batch["id"], "custom_id": line.custom_id}))
    if refused:
        _r().hset(protocol.batch_rejected_key(batch["id"]), mapping=refused)
    return queued


def _stop_jobs(batch: dict) -> None:
    """Cancel every line still waiting or running (a running one stops at its next token)."""
    for start in range(0, batch["lines"], CHUNK):
        _renew(batch["id"])
        ids = [protocol.batch_job_id(batch["id"], i) for i in range(start, min(start + CHUNK, batch["lines"]))]
        live = [i for i, st in zip(ids, queue.states(ids)) if st in ("queued", "running")]
        for job in queue.fetch_many(live):
            if job is not None:
                queue.cancel(job)


def _finalize(batch: dict, counts: dict) -> None:
    """Write the output and error files (one line per request, in input order), then end the batch."""
    batch_id = batch["id"]
    if not _transition(batch_id, ("in_progress", "cancelling", "finalizing"), "finalizing",
                       finalizing_at=batch.get("finalizing_at") or int(time.time())):
        return
    batch = load(batch_id)   # a cancel may have come meanwhile
    hexid, files = batch_id.removeprefix("batch_"), {}
    cancelled = counts["total"] - counts["completed"] - counts["failed"]
    for ok, name, any_lines in ((True, "output", counts["completed"]), (False, "errors", counts["failed"] + cancelled)):
        if not any_lines:
            continue

        def write(out, ok=ok):
            for good, line in result_lines(batch, _renew):
                if good == ok:
                    out.write((json.dumps(line) + "\n").encode())
        files[name] = filestore.add(f"file-{hexid}-{name}", f"{batch_id}_{name}.jsonl", "batch_output", write)["id"]
    status, stamp = {None: ("completed", "completed_at"), "cancelled": ("cancelled", "cancelled_at"),
                     "expired": ("expired", "expired_at")}[batch["stop"]]
    if _transition(batch_id, ("finalizing",), status, **{stamp: int(time.time())}, request_counts=counts,
                   output_file_id=files.get("output"), error_file_id=files.get("errors")):
        _r().delete(protocol.batch_rejected_key(batch_id))


def sweep(app, interval: float) -> None:
    """Every web process's background loop: advance every open batch whose lock is free."""
    while True:
        time.sleep(interval)
        with app.app_context():
            try:
                for batch_id in [i.decode() for i in _r().zrange(protocol.OPEN_BATCHES, 0, -1)]:
                    token = uuid.uuid4().hex
                    if _r().set(protocol.batch_lock_key(batch_id), token, nx=True, ex=LOCK_TTL):
                        _advance_locked(app, batch_id, token)
            except queue.UNAVAILABLE:
                continue   # Redis is away: the next round tries again
            except Exception:   # the loop must outlive any one failure
                app.logger.exception("batch sweep failed; trying again in %s s", interval)
