"""The worker's two Redis clients (one that waits out any outage, one that fails at once) and
the wait for a Redis that is not there when the worker starts."""
import logging
import time

from redis import Redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError, TimeoutError
from redis.retry import Retry

log = logging.getLogger(__name__)
UNREACHABLE = (ConnectionError, TimeoutError)


class _SharedRetry(Retry):
    """redis-py copies a client's retry policy into each connection; this one stays one object,
    so that a stop can cut short the waits already under way (see GPUWorker.request_stop)."""

    def __deepcopy__(self, memo):
        return self


def connect(url: str) -> tuple[Redis, Redis]:
    """Two clients of the worker's Redis: one whose commands wait out any outage (RQ, the
    threads), and one that fails at once, for the batch's outbox."""
    patient = Redis.from_url(url, socket_connect_timeout=5, retry_on_error=list(UNREACHABLE),
                             retry=_SharedRetry(ExponentialWithJitterBackoff(base=0.1, cap=2.0), -1))
    prompt = Redis.from_url(url, socket_connect_timeout=2, socket_timeout=10, retry=Retry(
        ExponentialWithJitterBackoff(), 0))
    return patient, prompt


def wait_for_redis(link: Redis) -> None:
    """Return once Redis answers. A worker started before its Redis (or given a wrong --redis-url)
    says so, where RQ's first command would wait for it in silence."""
    waiting = False
    while True:
        try:
            link.ping()
        except UNREACHABLE as e:
            if not waiting:
                where = link.connection_pool.connection_kwargs
                log.warning("Redis at %s is unreachable (%s); waiting for it",
                            where.get("path") or f"{where.get('host')}:{where.get('port')}", e)
                waiting = True
            time.sleep(1)
            continue
        if waiting:
            log.info("Redis is up")
        return
