"""When Redis counts as away, one definition for the worker and the web app: it cannot be reached
(refused, reset, silent past a timeout), or it answers but refuses every write for now: MISCONF (its
last snapshot or append-only write failed, a full or failing disk, and stop-writes-on-bgsave-error
is on; PING is refused too) or READONLY (a replica, until a failover makes it the primary).

redis-py raises a plain ResponseError for those refusals, which nothing waits out. The clients both
sides make (CLIENT_OPTIONS) parse them as RefusesWrites, a ConnectionError, as redis-py itself parses
LOADING (a Redis still reading its data): so whatever waits out or reports an outage (the worker's
endless retry, RQ's own loops, the outbox, the web app's 503) does the same for them.

The worker also counts OOM as away (WORKER_OPTIONS): Redis at its maxmemory, which never evicts,
refuses the writes that may grow it (SET, HSET, XADD, any MULTI) until finished jobs expire or an
admin frees memory; a running job can wait for that, its text kept in the outbox. The web app's
clients keep OOM a ResponseError (redis-py's OutOfMemoryError): a request answers 503 store_full
at once, where a wait would hold it for as long as Redis stays full."""
from redis.connection import DefaultParser
from redis.exceptions import ConnectionError, TimeoutError

UNAVAILABLE = (ConnectionError, TimeoutError)


class RefusesWrites(ConnectionError):
    """Redis answers, but refuses writes for now (MISCONF, READONLY; OOM for the worker)."""

    def __str__(self):   # the parser strips the code off Redis's message; it says which refusal this is
        return f"{self.status_code} {super().__str__()}"


class _Parser(DefaultParser):
    EXCEPTION_CLASSES = DefaultParser.EXCEPTION_CLASSES | {"MISCONF": RefusesWrites, "READONLY": RefusesWrites}


class _WorkerParser(_Parser):
    EXCEPTION_CLASSES = _Parser.EXCEPTION_CLASSES | {"OOM": RefusesWrites}


# for Redis.from_url. RESP2: the protocol whose parser (redis-py's DefaultParser) _Parser extends;
# redis-py 8 would speak RESP3 through another parser class.
CLIENT_OPTIONS = {"parser_class": _Parser, "protocol": 2}
WORKER_OPTIONS = {"parser_class": _WorkerParser, "protocol": 2}


def full(memory: dict) -> bool:
    """Whether a Redis at its maxmemory refuses the writes that may grow it (OOM), from its INFO
    memory: what it counts against maxmemory (its replication and append-only buffers not
    counted) is past it. No maxmemory: never."""
    limit = memory.get("maxmemory", 0)
    return limit > 0 and memory["used_memory"] - memory.get("mem_not_counted_for_evict", 0) > limit


def describe(error: Exception) -> str:
    """What is wrong with Redis, without its address (/readyz shows it): "unreachable", or
    "refuses writes: " and Redis's own reason."""
    return f"refuses writes: {error}" if isinstance(error, RefusesWrites) else "unreachable"
