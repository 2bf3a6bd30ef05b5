"""Batches move on in steps, each done by whichever web process holds the batch's lock
(protocol.batch_lock_key): validating (the input file read, each line checked as its endpoint
checks a request and queued; resumable, since a line's job id is known), stopping the jobs of a
cancelled or expired batch, and finalizing (the output and error files written, in input order,
once no line is left to run). Any read that finds a step due starts it in a thread, and every web
process sweeps the open batches every BATCH_SWEEP_INTERVAL seconds, so no step depends on one
process staying up."""
import json
import threading
import time
import uuid

from flask import current_app

from appliance import filestore, openai_api, queue, requestbody
from appliance.batchlines import Line, read_lines, result_lines
from appliance.batchstore import (
    CHUNK,
    ENDPOINTS,
    TERMINAL,
    choices,
    line_jobs,
    load,
    put,
    redis,
    tally,
    transition,
    view,
)
from appliance.schema import Invalid
from vkllm import protocol

# seconds a step holds a batch unless it goes on (each chunk renews it): more than a chunk of
# validation takes when every line waits out its token count (TOKENIZE_TIMEOUT)
LOCK_TTL = 300
VALIDATION_CHUNK = 50
MAX_ERRORS = 100  # validation errors reported of a file that cannot be run
UNLOCK = """if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"""


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
    transition(batch_id, ("validating", "in_progress"), "cancelling", cancelling_at=int(time.time()),
                stop="cancelled")
    kick(batch_id)
    return current(batch_id)


def listing(after: str | None, limit: int) -> tuple[list[dict], bool]:
    """Newest first, the page after batch id `after`; whether more follow."""
    r = redis()
    start = 0
    if after:
        rank = r.zrevrank(protocol.BATCHES, after)
        start = 0 if rank is None else rank + 1
    ids = [i.decode() for i in r.zrevrange(protocol.BATCHES, start, start + limit)]
    return [b for b in (current(i) for i in ids[:limit]) if b], len(ids) > limit


def kick(batch_id: str) -> bool:
    """Start the batch's next step in a thread unless some process is at it already."""
    token = uuid.uuid4().hex
    if not redis().set(protocol.batch_lock_key(batch_id), token, nx=True, ex=LOCK_TTL):
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
            redis().eval(UNLOCK, 1, protocol.batch_lock_key(batch_id), token)


def _renew(batch_id: str) -> None:
    redis().expire(protocol.batch_lock_key(batch_id), LOCK_TTL)


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
        put(redis(), batch_id, stop="expired")
        batch["stop"] = "expired"
    if batch["stop"]:
        _stop_jobs(batch)
    queue.reap_batch_queues(_models(batch))
    counts, pending = tally(batch)
    put(redis(), batch_id, request_counts=counts)
    if pending == 0:
        _finalize(batch, counts)


def _models(batch: dict) -> set[str]:
    return set(batch.get("models") or ())


def _fail(batch: dict, errors: list[dict]) -> None:
    transition(batch["id"], ("validating",), "failed", failed_at=int(time.time()),
                errors={"object": "list", "data": errors[:MAX_ERRORS]})


def _validate(batch: dict) -> None:
    """Check the input file as a whole (a malformed file fails the batch, as in OpenAI's), then
    each request as its endpoint does (a refused one goes to the error file) and queue it."""
    lines, errors = read_lines(batch, current_app.config["MAX_BATCH_LINES"])
    if errors:
        _fail(batch, errors)
        return
    r, batch_id = redis(), batch["id"]
    models = sorted({line.model for line in lines if line.model})
    put(r, batch_id, lines=len(lines), models=models, model=models[0] if len(models) == 1 else None,
         request_counts={"total": len(lines), "completed": 0, "failed": 0})
    batch |= {"lines": len(lines), "models": models}
    for start in range(0, len(lines), VALIDATION_CHUNK):
        _renew(batch_id)
        if json.loads(r.hget(protocol.batch_key(batch_id), "status")) != "validating":
            return   # cancelled meanwhile: the lines not queued yet never will be
        chunk = lines[start:start + VALIDATION_CHUNK]
        ids = [protocol.batch_job_id(batch_id, line.number) for line in chunk]
        done = {int(i) for i in r.hkeys(protocol.batch_rejected_key(batch_id))}
        exists = [s is not None for s in queue.states(ids)]
        todo = [line for line, there in zip(chunk, exists) if not there and line.number not in done]
        queue.submit_batch(_checked(batch, todo))
    transition(batch_id, ("validating",), "in_progress", in_progress_at=int(time.time()))


def _checked(batch: dict, lines: list[Line]) -> list[tuple[str, dict, dict]]:
    """The lines' generations to queue (n of them for a request with n choices, as its endpoint
    runs it); those their endpoint refuses go to the error file now."""
    chat, queued, refused, many = ENDPOINTS[batch["endpoint"]], [], {}, {}
    for line in lines:
        job_id = protocol.batch_job_id(batch["id"], line.number)
        try:
            requestbody.check(line.body)
            _, gen, n = openai_api.parse(line.body, chat)
        except Invalid as e:
            refused[line.number] = json.dumps({
                "id": f"batch_req_{job_id}", "custom_id": line.custom_id,
                "response": {"status_code": e.status, "request_id": job_id, "body": e.body()}, "error": None})
            continue
        if n > 1:
            many[line.number] = n
        queued += [(protocol.batch_job_id(batch["id"], line.number, c), sequence,
                    {"batch": batch["id"], "custom_id": line.custom_id})
                   for c, sequence in enumerate(openai_api.sequences(gen, n))]
    if refused:
        redis().hset(protocol.batch_rejected_key(batch["id"]), mapping=refused)
    if many:   # before the jobs: a line's count of jobs is known wherever one of them is
        redis().hset(protocol.batch_choices_key(batch["id"]), mapping=many)
    return queued


def _stop_jobs(batch: dict) -> None:
    """Cancel every line still waiting or running (a running one stops at its next token)."""
    many = choices(batch["id"])
    for start in range(0, batch["lines"], CHUNK):
        _renew(batch["id"])
        ids = [job_id for jobs in line_jobs(batch["id"], range(start, min(start + CHUNK, batch["lines"])), many)
               for job_id in jobs]
        live = [i for i, st in zip(ids, queue.states(ids)) if st in ("queued", "running")]
        for job in queue.fetch_many(live):
            if job is not None:
                queue.cancel(job)


def _finalize(batch: dict, counts: dict) -> None:
    """Write the output and error files (one line per request, in input order), then end the batch."""
    batch_id = batch["id"]
    if not transition(batch_id, ("in_progress", "cancelling", "finalizing"), "finalizing",
                       finalizing_at=batch.get("finalizing_at") or int(time.time())):
        return
    batch = load(batch_id)   # a cancel may have come meanwhile
    hexid, files = batch_id.removeprefix("batch_"), {}
    written = {"completed": 0, "failed": 0}   # the counts as the files have them
    cancelled = counts["total"] - counts["completed"] - counts["failed"]
    for ok, name, expected in ((True, "output", counts["completed"]), (False, "errors", counts["failed"] + cancelled)):
        if not expected:
            continue

        def write(out, ok=ok):
            for good, line in result_lines(batch, _renew):
                if good != ok:
                    continue
                out.write((json.dumps(line) + "\n").encode())
                if good:
                    written["completed"] += 1
                elif line["error"] is None or line["error"]["code"] == "job_expired":   # not cancelled
                    written["failed"] += 1
        files[name] = filestore.add(f"file-{hexid}-{name}", f"{batch_id}_{name}.jsonl", "batch_output", write)["id"]
    status, stamp = {None: ("completed", "completed_at"), "cancelled": ("cancelled", "cancelled_at"),
                     "expired": ("expired", "expired_at")}[batch["stop"]]
    if transition(batch_id, ("finalizing",), status, **{stamp: int(time.time())},
                  request_counts={"total": counts["total"]} | written,
                  output_file_id=files.get("output"), error_file_id=files.get("errors")):
        redis().delete(protocol.batch_rejected_key(batch_id), protocol.batch_choices_key(batch_id))


def sweep(app, interval: float) -> None:
    """Every web process's background loop: advance every open batch whose lock is free."""
    while True:
        time.sleep(interval)
        with app.app_context():
            try:
                for batch_id in [i.decode() for i in redis().zrange(protocol.OPEN_BATCHES, 0, -1)]:
                    token = uuid.uuid4().hex
                    if redis().set(protocol.batch_lock_key(batch_id), token, nx=True, ex=LOCK_TTL):
                        _advance_locked(app, batch_id, token)
            except queue.UNAVAILABLE:
                continue   # Redis is away: the next round tries again
            except Exception:   # the loop must outlive any one failure
                app.logger.exception("batch sweep failed; trying again in %s s", interval)
