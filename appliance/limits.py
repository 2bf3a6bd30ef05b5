"""Bounds on what clients can make the appliance hold: jobs waiting per model (MAX_QUEUED) and
submissions per API key per minute (JOBS_PER_MINUTE), both counted in Redis so that every web
process shares them. A submission over either gets 429 with Retry-After."""
import time

from flask import current_app

from appliance import auth, queue
from appliance.schema import Invalid
from vkllm import protocol

QUEUE_FULL_RETRY = 10   # seconds a client is told to wait when a model's queue is full


class Limited(Invalid):
    def __init__(self, message: str, code: str, retry_after: int):
        super().__init__(message, None, 429, code)
        self.retry_after = retry_after

    def body(self) -> dict:
        return {"error": super().body()["error"] | {"type": "rate_limit_error"}}


def admit(model: str, jobs: int = 1) -> None:
    """Raise Limited unless `jobs` more jobs for `model` (a request's n choices, say) may be
    submitted now, all of them, and count them against the key's minute; a refusal counts none."""
    cfg, r = current_app.config, queue.get_redis()
    waiting = queue.queue_length(model)
    if waiting + jobs > cfg["MAX_QUEUED"]:
        raise Limited(f"the queue for {model} is full ({waiting} jobs waiting); try again later", "queue_full",
                      QUEUE_FULL_RETRY)
    # fixed one-minute windows: a counter per key and minute, gone a minute after its window
    now = time.time()
    key = protocol.rate_key(auth.key_generation(), int(now // 60))
    with r.pipeline() as pipe:
        pipe.incrby(key, jobs)
        pipe.expire(key, 120)
        count = pipe.execute()[0]
    if count > cfg["JOBS_PER_MINUTE"]:
        r.decrby(key, jobs)   # none of them is queued: they spend none of the minute's budget
        raise Limited(f"more than {cfg['JOBS_PER_MINUTE']} jobs a minute were submitted with this key; "
                      f"try again later", "rate_limit_exceeded", 60 - int(now % 60))
