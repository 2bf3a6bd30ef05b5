"""The worker's two Redis clients (one that waits out any outage, one that fails at once), the
wait for a Redis that is not there when the worker starts, and the check of its version."""
import logging
import time

from redis import Redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from vkllm.errors import VkllmError
from vkllm.outage import UNAVAILABLE, WORKER_OPTIONS, RefusesWrites

log = logging.getLogger(__name__)
MIN_REDIS = (6, 2)   # LMOVE, in the script that takes jobs (worker/service/taking.py)


class _SharedRetry(Retry):
    """redis-py copies a client's retry policy into each connection; this one stays one object,
    so that a stop can cut short the waits already under way (see GPUWorker.request_stop)."""

    def __deepcopy__(self, memo):
        return self


def connect(url: str) -> tuple[Redis, Redis]:
    """Two clients of the worker's Redis: one whose commands wait out any outage (RQ, the
    threads), and one that fails at once, for the batch's outbox. Both count a Redis that refuses
    writes as away, a full one (OOM) too (vkllm.outage.WORKER_OPTIONS)."""
    patient = Redis.from_url(url, socket_connect_timeout=5, retry_on_error=list(UNAVAILABLE),
                             retry=_SharedRetry(ExponentialWithJitterBackoff(base=0.1, cap=2.0), -1), **WORKER_OPTIONS)
    prompt = Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10, retry=Retry(
        ExponentialWithJitterBackoff(), 0), **WORKER_OPTIONS)
    return patient, prompt


def wait_for_redis(link: Redis) -> None:
    """Return once Redis answers (then refuse one older than MIN_REDIS, `check_version`). A worker
    started before its Redis (or given a wrong --redis-url) says so, where RQ's first command
    would wait for it in silence."""
    waiting = False
    while True:
        try:
            link.ping()   # refused by a Redis refusing writes (MISCONF), where INFO answers
            version = link.info("server")["redis_version"]
        except UNAVAILABLE as e:
            if not waiting:
                log.warning("Redis at %s %s (%s); waiting for it", _where(link),
                            "refuses writes" if isinstance(e, RefusesWrites) else "is unreachable", e)
                waiting = True
            time.sleep(1)
            continue
        if waiting:
            log.info("Redis is up")
        check_version(version, _where(link))
        return


def check_version(version: str, where: str) -> None:
    """A Redis older than MIN_REDIS is refused with a line, where the worker's first take would
    fail inside a script."""
    if tuple(int(part) for part in version.split(".")[:2]) < MIN_REDIS:
        raise VkllmError(f"Redis at {where} is {version}; the worker needs Redis "
                         f"{'.'.join(map(str, MIN_REDIS))} or later (it takes jobs with LMOVE)")


def _where(link: Redis) -> str:
    where = link.connection_pool.connection_kwargs
    return where.get("path") or f"{where.get('host')}:{where.get('port')}"
