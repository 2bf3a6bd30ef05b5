"""Batches (OpenAI's Batch API) as Redis keeps them: each batch's fields in a hash
(protocol.batch_key), its status changed only from an expected one (first change wins), its request
counts read from its lines' jobs. batchwork moves batches on.

Request counts follow the jobs: completed (finished), failed (refused lines, failed jobs); lines
cancelled or expired count as neither, as in OpenAI's."""
import json
import time
import uuid

from redis import Redis
from redis.exceptions import WatchError

from appliance import queue
from vkllm import protocol

TERMINAL = ("completed", "failed", "cancelled", "expired")
ENDPOINTS = {"/v1/chat/completions": True, "/v1/completions": False}   # endpoint -> whether chat
WINDOWS = {"24h": 24 * 3600}
INTERNAL = ("lines", "stop", "models")   # fields kept with a batch that OpenAI's object does not have
CHUNK = 500   # jobs read per round trip


def redis() -> Redis:
    return queue.get_redis()


def load(batch_id: str) -> dict | None:
    raw = redis().hgetall(protocol.batch_key(batch_id))
    return {k.decode(): json.loads(v) for k, v in raw.items()} or None


def put(pipe, batch_id: str, **fields) -> None:
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
    with redis().pipeline() as pipe:
        put(pipe, batch["id"], **batch)
        pipe.zadd(protocol.BATCHES, {batch["id"]: time.time()})
        pipe.zadd(protocol.OPEN_BATCHES, {batch["id"]: time.time()})
        pipe.execute()
    return view(batch)


def transition(batch_id: str, sources: tuple[str, ...], status: str, **fields) -> bool:
    """Set the status (and fields) only if it is one of `sources` now: steps and cancel requests
    of several processes may race, and the first one wins."""
    r, key = redis(), protocol.batch_key(batch_id)
    with r.pipeline() as pipe:
        pipe.watch(key)
        now = pipe.hget(key, "status")
        if now is None or json.loads(now) not in sources:
            return False
        pipe.multi()
        put(pipe, batch_id, status=status, **fields)
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


def choices(batch_id: str) -> dict[int, int]:
    """Input line number -> n, for the lines that asked for several choices (the others have one)."""
    return {int(k): int(v) for k, v in redis().hgetall(protocol.batch_choices_key(batch_id)).items()}


def line_jobs(batch_id: str, numbers, many: dict[int, int]) -> list[list[str]]:
    """The job ids of each of the lines `numbers`, one per choice (`many`: see choices)."""
    return [[protocol.batch_job_id(batch_id, i, c) for c in range(many.get(i, 1))] for i in numbers]


def line_state(states: list[str | None]) -> str | None:
    """A line's state from its choices' jobs' states: the first of running, waiting, failed,
    gone (None), cancelled that one of them is; finished once all are."""
    return next((st for st in ("running", "queued", "failed", None, "cancelled") if st in states), "finished")


def line_states(batch_id: str, numbers, many: dict[int, int]) -> list[str | None]:
    jobs = line_jobs(batch_id, numbers, many)
    flat = iter(queue.states([job_id for ids in jobs for job_id in ids]))
    return [line_state([next(flat) for _ in ids]) for ids in jobs]


def tally(batch: dict) -> tuple[dict, int]:
    """Request counts from the jobs now, and how many lines still wait or run."""
    r, lines = redis(), batch["lines"]
    if lines is None:
        return batch["request_counts"], 1
    rejected = {int(i) for i in r.hkeys(protocol.batch_rejected_key(batch["id"]))}
    completed, failed, pending = 0, len(rejected), 0
    numbers, many = [i for i in range(lines) if i not in rejected], choices(batch["id"])
    for start in range(0, len(numbers), CHUNK):
        for st in line_states(batch["id"], numbers[start:start + CHUNK], many):
            if st == "finished":
                completed += 1
            elif st == "failed":
                failed += 1
            elif st in ("queued", "running") or (st is None and batch["status"] == "validating"):
                pending += 1
            elif st is None and not batch["stop"]:   # its record expired: nothing to report of it
                failed += 1
    return {"total": lines, "completed": completed, "failed": failed}, pending
