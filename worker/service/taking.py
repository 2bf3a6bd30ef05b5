"""How the worker takes jobs from its queues: each pop moves the job id, in the same Redis
command, into this worker start's taking list (protocol.taking_key), which it leaves in the
transaction that puts the job in RQ's started registry (GPUWorker.prepare_execution). A worker
that dies in between (killed, or stopped while Redis is away) leaves the id there, and the
watchdog puts the job back at the front of its queue (vkllm.orphans.requeue_taken); a plain pop
(RQ's BLPOP/LPOP) left it in no queue and no registry, "queued" for ever.

RQ's own intermediate queue (RQ >= 2) does not fit: RQ uses it only for a worker of one queue
(ours has two per model), it is one list per queue with no owner, and its cleanup fails a job
found there a minute later, whether or not its worker is alive."""
import json

from redis import Redis
from rq import Queue
from rq.exceptions import DequeueTimeout
from rq.job import Job

from vkllm import protocol

# The first job of the first non-empty queue (KEYS in order, the taking list last), moved into the
# taking list in one command. One command for all queues: a chat request queued between pops of
# the interactive and the batch queue would otherwise lose its turn to a batch line.
TAKE_FIRST = """local taking = KEYS[#KEYS]
for i = 1, #KEYS - 1 do
    local id = redis.call('lmove', KEYS[i], taking, 'LEFT', 'RIGHT')
    if id then return {KEYS[i], id} end
end
return false"""
# Seconds an idle worker blocks on its first queue before it looks at all of them again: BLMOVE
# blocks on one list, so a job in another queue (batch lines, a second model) waits up to this.
BLOCK_SECONDS = 1.0


class Taking:
    def __init__(self, connection: Redis, worker: str, instance: str, liveness_ttl: int):
        self.key = protocol.taking_key(instance)
        self.instance = instance
        self.record = json.dumps({"worker": worker, "liveness_ttl": liveness_ttl})
        self._script = connection.register_script(TAKE_FIRST)

    def pop(self, queues: list[Queue], client: Redis) -> tuple[str, str] | None:
        """(queue key, job id) of the job taken from the first non-empty queue, or None."""
        popped = self._script(keys=[q.key for q in queues] + [self.key], client=client)
        return None if popped is None else tuple(v.decode() for v in popped)

    def dequeue(self, queues: list[Queue], timeout: int | None, connection: Redis,
                **fetch) -> tuple[Job, Queue] | None:
        """RQ's dequeue_any, taking: None at once when all queues are empty and timeout is None
        (burst), else DequeueTimeout after `timeout` seconds."""
        waited = 0.0
        while True:
            popped = self.pop(queues, connection)
            if popped is None and timeout is not None:
                if waited >= timeout:
                    raise DequeueTimeout(timeout, [q.key for q in queues])
                block = min(BLOCK_SECONDS, timeout - waited)
                waited += block
                job_id = connection.blmove(queues[0].key, self.key, block, "LEFT", "RIGHT")
                popped = None if job_id is None else (queues[0].key, job_id.decode())
                if popped is None:
                    continue
            if popped is None:
                return None
            taken = self.fetch(connection, *popped, **fetch)
            if taken is not None:
                return taken

    def fetch(self, connection: Redis, queue_key: str, job_id: str, **fetch) -> tuple[Job, Queue] | None:
        """As RQ does after its pop: None for a job deleted meanwhile (it leaves the list), so that
        the next one is taken."""
        taken = Queue._fetch_dequeued_job(connection, queue_key, job_id, **fetch)
        if taken is None:
            connection.lrem(self.key, 1, job_id)
        return taken

    def started(self, job_id: str, pipeline) -> None:
        """The job leaves the list, in the transaction that starts it."""
        pipeline.lrem(self.key, 1, job_id)

    def register(self, pipeline) -> None:
        """For the watchdog: whose this list is, how long to wait for its worker; its note that the
        worker looked gone, if a sweep made one (after a Redis restart, before this heartbeat)."""
        pipeline.hset(protocol.TAKERS, self.instance, self.record)
        pipeline.delete(protocol.taker_gone_key(self.instance))

    def leave(self, connection: Redis) -> None:
        """A worker that ends cleanly unregisters its list, unless jobs are left in it (a stop
        while Redis was away): the watchdog gives those back."""
        if not connection.llen(self.key):
            connection.hdel(protocol.TAKERS, self.instance)


def queue_class(taking: Taking) -> type[Queue]:
    """RQ's Queue whose dequeue_any, which RQ's idle wait calls as a class method (no worker at
    hand), takes into `taking`."""
    class TakingQueue(Queue):
        @classmethod
        def dequeue_any(cls, queues, timeout, connection, **fetch):
            return taking.dequeue(queues, timeout, connection, **fetch)
    return TakingQueue
