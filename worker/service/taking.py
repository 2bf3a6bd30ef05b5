"""How the worker takes jobs from its queues: each take moves the job id, in one Redis command,
into this worker start's taking list (protocol.taking_key), which it leaves in the transaction
that puts the job in RQ's started registry (GPUWorker.prepare_execution). A worker that dies in
between (killed, or stopped while Redis is away) leaves the id there, and the watchdog puts the
job back at the front of its queue (vkllm.orphans.requeue_taken); a plain pop (RQ's BLPOP) left
it in no queue and no registry, "queued" for ever.

Redis has no blocking move over several lists, so an idle worker blocks (BLPOP) on its queues'
wake lists, where every push of a job leaves a token (vkllm.jobqueue), and takes once woken.

RQ's own intermediate queue (RQ >= 2) does not fit: RQ uses it only for a worker of one queue
(ours has two per model), it is one list per queue with no owner, and its cleanup fails a job
found there a minute later, whether or not its worker is alive."""
import json
import time

from redis import Redis
from rq import Queue
from rq.exceptions import DequeueTimeout
from rq.job import Job

from vkllm import protocol
from vkllm.jobqueue import WAKE, JobQueue, give_back

# The first job of the first non-empty queue, moved into the taking list. KEYS: the n queues in
# order, their n wake lists, the taking list; ARGV: the index (from 1) of the wake list whose token
# woke the caller, or 0, then WAKE. One script for all queues: a chat request queued between pops
# of the interactive and the batch queue would otherwise lose its turn to a batch line.
# Tokens beyond a queue's jobs are stale (their jobs taken between steps, or cancelled): each queue
# looked at keeps no more tokens than jobs, so the lists stay short while workers are busy. A token
# that woke the caller for another queue than the one it took from goes back, if that queue still
# has more jobs than tokens: a worker that does not serve the first queue may be waiting for it.
TAKE = """local n = (#KEYS - 1) / 2
local taking, woke = KEYS[#KEYS], tonumber(ARGV[1])
for i = 1, n do
    local id = redis.call('lmove', KEYS[i], taking, 'LEFT', 'RIGHT')
    local left = redis.call('llen', KEYS[i])
    if left == 0 then redis.call('del', KEYS[n + i]) else redis.call('ltrim', KEYS[n + i], 0, left - 1) end
    if id then
        if woke > 0 and woke ~= i and redis.call('llen', KEYS[n + woke]) < redis.call('llen', KEYS[woke]) then
            redis.call('rpush', KEYS[n + woke], ARGV[2])
        end
        return {KEYS[i], id}
    end
end
return false"""
# Seconds an idle worker waits for a token before it looks at its queues all the same: how long a
# job pushed without one (`rq requeue`) may wait for an idle worker.
UNWOKEN_LOOK_SECONDS = 5.0


class Taking:
    def __init__(self, connection: Redis, worker: str, instance: str, liveness_ttl: int):
        self.key = protocol.taking_key(instance)
        self.instance = instance
        self.record = json.dumps({"worker": worker, "liveness_ttl": liveness_ttl})
        self._script = connection.register_script(TAKE)

    def take(self, queues: list[Queue], client: Redis, woke: int = 0) -> tuple[str, str] | None:
        """(queue key, job id) of the job taken from the first non-empty queue, or None."""
        keys = [q.key for q in queues] + [protocol.wake_key(q.name) for q in queues] + [self.key]
        taken = self._script(keys=keys, args=[woke, WAKE], client=client)
        return None if taken is None else tuple(v.decode() for v in taken)

    def dequeue(self, queues: list[Queue], timeout: int | None, connection: Redis,
                **fetch) -> tuple[Job, Queue] | None:
        """RQ's dequeue_any, taking: None at once when all queues are empty and timeout is None
        (burst), else DequeueTimeout after `timeout` seconds."""
        wakes = [protocol.wake_key(q.name) for q in queues]
        deadline = None if timeout is None else time.monotonic() + timeout
        woke = 0
        while True:
            taken = self.take(queues, connection, woke)
            if taken is not None:
                job = self.fetch(connection, *taken, **fetch)
                if job is not None:
                    return job
                woke = 0
                continue
            if deadline is None:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise DequeueTimeout(timeout, [q.key for q in queues])
            # at least 10 ms: a BLPOP timeout of 0 would block for ever
            woken = connection.blpop(wakes, timeout=max(0.01, min(UNWOKEN_LOOK_SECONDS, left)))
            woke = 0 if woken is None else wakes.index(woken[0].decode()) + 1

    def fetch(self, connection: Redis, queue_key: str, job_id: str, **fetch) -> tuple[Job, Queue] | None:
        """As RQ does after its pop: None for a job deleted meanwhile (it leaves the list), so that
        the next one is taken."""
        taken = JobQueue._fetch_dequeued_job(connection, queue_key, job_id, **fetch)
        if taken is None:
            connection.lrem(self.key, 1, job_id)
        return taken

    def started(self, job_id: str, pipeline) -> None:
        """The job leaves the list, in the transaction that starts it."""
        pipeline.lrem(self.key, 1, job_id)

    def register(self, pipeline) -> None:
        """For the watchdog: whose this list is, how long to wait for its worker (the worker's
        heartbeat deletes the watchdog's note that it looked gone, GPUWorker._forget_gone_notes)."""
        pipeline.hset(protocol.TAKERS, self.instance, self.record)

    def leave(self, connection: Redis) -> None:
        """A worker that stops gives back what it took and did not start (the first taken ends
        first in its queue) and unregisters its list; with Redis away, the watchdog gives them back."""
        for job_id in reversed([i.decode() for i in connection.lrange(self.key, 0, -1)]):
            give_back(connection, self.key, job_id)
        connection.hdel(protocol.TAKERS, self.instance)


def queue_class(taking: Taking) -> type[Queue]:
    """The Queue class of the worker: JobQueue (what RQ itself pushes wakes the workers), whose
    dequeue_any, which RQ's idle wait calls as a class method (no worker at hand), takes into
    `taking`."""
    class TakingQueue(JobQueue):
        @classmethod
        def dequeue_any(cls, queues, timeout, connection, **fetch):
            return taking.dequeue(queues, timeout, connection, **fetch)
    return TakingQueue
