"""A running job's link to Redis that rides out outages: generation goes on while Redis is down.

Stream records wait here, in order, until Redis takes them again; between attempts the link backs
off (exponentially, up to a few seconds), so a dead Redis costs a token no more than a clock read.
Reads made on the way (the cancel flag) answer a default meanwhile. The records of one flush go in
one MULTI/EXEC, so a flush cut by the outage is applied whole or not at all, never half.

Each record carries its own stream id, 0-1, 0-2, ... in the order sent: a flush that Redis applied
but whose reply the outage cut is sent again, and Redis refuses the ids it already holds, so no
record is written twice. (Those ids sort before any Redis-made one: once another writer has closed
the stream, as the orphan watchdog does for a job it failed, this job's late records are refused
too.)"""
import logging
import time

from redis import Redis
from redis.exceptions import ConnectionError, ResponseError, TimeoutError

log = logging.getLogger(__name__)
UNREACHABLE = (ConnectionError, TimeoutError)
ALREADY_THERE = "equal or smaller than the target stream top item"   # Redis's XADD error for an old id


class Outbox:
    def __init__(self, connection: Redis, stream: str, ttl: int, *, first_wait: float = 0.05, max_wait: float = 2.0):
        self.connection, self.stream, self.ttl = connection, stream, ttl
        self.first_wait, self.max_wait = first_wait, max_wait
        self.pending: list[tuple[str, dict]] = []   # (stream id, fields)
        self._sent = 0
        self._wait = first_wait
        self._retry_at = 0.0   # monotonic time before which Redis is not tried again

    @property
    def reachable(self) -> bool:
        """Whether Redis answered last time it was tried, or its backoff is over."""
        return time.monotonic() >= self._retry_at

    def send(self, fields: dict) -> None:
        """Queue a stream record and send what waits, if Redis is not in its backoff."""
        self._sent += 1
        self.pending.append((f"0-{self._sent}", fields))
        self.flush()

    def call(self, fn, default):
        """fn() against Redis, or default while it is unreachable."""
        if not self.reachable:
            return default
        try:
            result = fn()
        except UNREACHABLE as e:
            self._failed(e)
            return default
        self._succeeded()
        return result

    def flush(self) -> bool:
        """Send the waiting records; False when Redis did not take them (they keep waiting)."""
        if not self.pending:
            return True
        if not self.reachable:
            return False
        try:
            with self.connection.pipeline(transaction=True) as pipe:
                for entry_id, fields in self.pending:
                    pipe.xadd(self.stream, fields, id=entry_id)
                pipe.expire(self.stream, self.ttl)
                results = pipe.execute(raise_on_error=False)
        except UNREACHABLE as e:
            self._failed(e)
            return False
        for result in results:
            if isinstance(result, ResponseError) and ALREADY_THERE not in str(result):
                raise result
        self.pending.clear()
        self._succeeded()
        return True

    def drain(self, deadline: float | None = None) -> bool:
        """Flush, waiting out an outage until everything is sent or the monotonic deadline passes."""
        while not self.flush():
            if deadline is not None and time.monotonic() >= deadline:
                log.error("Redis still unreachable; %d records of %s are lost", len(self.pending), self.stream)
                return False
            time.sleep(max(0.0, self._retry_at - time.monotonic()))
        return True

    def _failed(self, error: Exception) -> None:
        if self._wait == self.first_wait:
            log.warning("Redis unreachable (%s); generation goes on, its records wait for Redis", error)
        self._retry_at = time.monotonic() + self._wait
        self._wait = min(self._wait * 2, self.max_wait)

    def _succeeded(self) -> None:
        if self._wait != self.first_wait:
            log.info("Redis is back; %s is up to date", self.stream)
        self._wait = self.first_wait
