"""The worker's two Redis clients (one that waits out any outage, one that fails at once) and
the wait for a Redis that is not there when the worker starts."""
import logging
import time

from redis import Redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from vkllm.outage import CLIENT_OPTIONS, UNAVAILABLE, RefusesWrites

log = logging.getLogger(__name__)


class _SharedRetry(Retry):
    """redis-py copies a client's retry policy into each connection; this one stays one object,
    so that a stop can cut short the waits already under way (see GPUWorker.request_stop)."""

    def __deepcopy__(self, memo):
        return self


def connect(url: str) -> tuple[Redis, Redis]:
    """Two clients of the worker's Redis: one whose commands wait out any outage (RQ, the
    threads), and one that fails at once, for the batch's outbox. Both count a Redis that refuses
    writes as away (vkllm.outage)."""
    patient = Redis.from_url(url, socket_connect_timeout=5, retry_on_error=list(UNAVAILABLE),
                             retry=_SharedRetry(ExponentialWithJitterBackoff(base=0.1, cap=2.0), -1), **CLIENT_OPTIONS)
    prompt = Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10, retry=Retry(
        ExponentialWithJitterBackoff(), 0), **CLIENT_OPTIONS)
    return patient, prompt


def wait_for_redis(link: Redis) -> None:
    """Return once Redis answers. A worker started before its Redis (or given a wrong --redis-url)
    says so, where RQ's first command would wait for it in silence."""
    waiting = False
    while True:
        try:
            link.ping()
        except UNAVAILABLE as e:
            if not waiting:
                where = link.connection_pool.connection_kwargs
                log.warning("Redis at %s %s (%s); waiting for it",
                            where.get("path") or f"{where.get('host')}:{where.get('port')}",
                            "refuses writes" if isinstance(e, RefusesWrites) else "is unreachable", e)
                waiting = True
            time.sleep(1)
            continue
        if waiting:
            log.info("Redis is up")
        return
