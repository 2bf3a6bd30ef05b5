"""The running jobs' link to Redis, one for the whole worker: it rides out outages, so generation
goes on while Redis is down, and each scheduler step costs one round trip for all its jobs.

Stream records wait here, in order per stream, until Redis takes them; `flush` sends every
stream's waiting records in one MULTI/EXEC (applied whole or not at all, never half), with the
step's other commands (cancel checks, progress) in the same transaction. Between attempts the link
backs off (exponentially, up to a few seconds), so a dead Redis costs a step no more than a clock
read; the step's other commands then answer nothing (not cancelled, as far as we know).

Each record carries its own stream id, 0-1, 0-2, ... in the order sent: a flush that Redis applied
but whose reply the outage cut is sent again, and Redis refuses the ids it already holds, so no
record is written twice. (Those ids sort before any Redis-made one: once another writer has closed
the stream, as the orphan watchdog does for a job it failed, this job's late records are refused
too.)"""
import logging
import time
from collections.abc import Callable

from redis import Redis
from redis.client import Pipeline
from redis.exceptions import ResponseError

from vkllm.outage import UNAVAILABLE

log = logging.getLogger(__name__)
ALREADY_THERE = "equal or smaller than the target stream top item"   # Redis's XADD error for an old id


class Outbox:
    def __init__(self, connection: Redis, *, first_wait: float = 0.05, max_wait: float = 2.0):
        self.connection = connection
        self.first_wait, self.max_wait = first_wait, max_wait
        self.pending: list[tuple[str, str, dict]] = []   # (stream, stream id, fields), in the order sent
        self._sent: dict[str, int] = {}    # stream -> records numbered so far
        self._ttl: dict[str, int] = {}
        self._wait = first_wait
        self._retry_at = 0.0   # monotonic time before which Redis is not tried again

    @property
    def up(self) -> bool:
        """Whether Redis took the last flush (or none failed yet)."""
        return self._wait == self.first_wait

    @property
    def reachable(self) -> bool:
        """Whether Redis answered last time it was tried, or its backoff is over."""
        return time.monotonic() >= self._retry_at

    def open(self, stream: str, ttl: int) -> None:
        """Start a stream (a job's): its records are numbered from 0-1, it lives `ttl` seconds."""
        self._sent[stream], self._ttl[stream] = 0, ttl

    def close(self, stream: str) -> None:
        """Forget a stream: once its records are delivered (see waiting), or given up on."""
        del self._sent[stream], self._ttl[stream]
        self.pending = [entry for entry in self.pending if entry[0] != stream]

    def send(self, stream: str, fields: dict) -> None:
        """Queue a record; it goes with the next flush."""
        self._sent[stream] += 1
        self.pending.append((stream, f"0-{self._sent[stream]}", fields))

    def waiting(self, stream: str) -> bool:
        """Whether records of this stream are still to be delivered."""
        return any(s == stream for s, _, _ in self.pending)

    def flush(self, extra: Callable[[Pipeline], None] | None = None) -> list | None:
        """Send the waiting records, and `extra`'s commands in the same transaction. Returns the
        extra commands' replies, or None when Redis was not tried or did not answer (the records
        keep waiting; the extra commands are dropped)."""
        if not self.reachable:
            return None
        sending = list(self.pending)
        try:
            with self.connection.pipeline(transaction=True) as pipe:
                for stream, entry_id, fields in sending:
                    pipe.xadd(stream, fields, id=entry_id)
                for stream in dict.fromkeys(s for s, _, _ in sending):
                    pipe.expire(stream, self._ttl[stream])
                ours = len(pipe)
                if extra is not None:
                    extra(pipe)
                if not len(pipe):
                    return []
                results = pipe.execute(raise_on_error=False)
        except UNAVAILABLE as e:
            self._failed(e)
            return None
        for result in results[:ours]:
            if isinstance(result, ResponseError) and ALREADY_THERE not in str(result):
                raise result
        del self.pending[:len(sending)]
        self._succeeded()
        return results[ours:]

    def drain(self, deadline: float | None = None) -> bool:
        """Flush, waiting out an outage until everything is sent or the monotonic deadline passes."""
        while self.flush() is None:
            if deadline is not None and time.monotonic() >= deadline:
                log.error("Redis still unavailable; %d stream records are lost", len(self.pending))
                return False
            self.pause(deadline)
        return True

    def pause(self, deadline: float | None = None) -> None:
        """Sleep until Redis may be tried again (or the deadline, if sooner)."""
        until = self._retry_at if deadline is None else min(self._retry_at, deadline)
        time.sleep(max(0.0, until - time.monotonic()))

    def _failed(self, error: Exception) -> None:
        if self._wait == self.first_wait:
            log.warning("Redis unavailable (%s); generation goes on, its records wait for Redis", error)
        self._retry_at = time.monotonic() + self._wait
        self._wait = min(self._wait * 2, self.max_wait)

    def _succeeded(self) -> None:
        if self._wait != self.first_wait:
            log.info("Redis is back; the job streams are up to date")
        self._wait = self.first_wait
