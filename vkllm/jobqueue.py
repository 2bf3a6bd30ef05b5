"""Putting jobs on the workers' queues, for both sides: every push of a job id onto a queue (a new
job from the web app, or a taken one given back by the watchdog or by a stopping worker) pushes a
wake-up token onto the queue's wake list (protocol.wake_key) in the same transaction.

An idle worker blocks on the wake lists of all its queues at once, not on the queues: its take
must move the job into its taking list in one command (worker/service/taking.py), and Redis has
no blocking move over several lists. A job pushed without a token (`rq requeue`) waits for the
worker's next look at its queues, a few seconds."""
from redis import Redis
from rq import Queue
from rq.job import Job

from vkllm import protocol

WAKE = "1"   # a token: what wakes a worker is its arrival, not its value

# KEYS: the taking list, the job's hash, its queue, the queue's wake list; ARGV: the job id, WAKE.
# Only the caller that removes the id gives the job back, and only a job still waiting: one
# deleted or cancelled meanwhile only leaves the list.
GIVE_BACK = """if redis.call('lrem', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
if redis.call('hget', KEYS[2], 'status') ~= 'queued' then return 0 end
redis.call('lpush', KEYS[3], ARGV[1])
redis.call('rpush', KEYS[4], ARGV[2])
return 1"""


class JobQueue(Queue):
    """RQ's Queue whose every push of a job id (enqueue_call, enqueue_many) wakes the queue's idle
    workers."""

    def push_job_id(self, job_id: str, pipeline=None, at_front: bool = False):
        pipe = pipeline if pipeline is not None else self.connection.pipeline()
        super().push_job_id(job_id, pipeline=pipe, at_front=at_front)
        pipe.rpush(protocol.wake_key(self.name), WAKE)
        if pipeline is None:
            pipe.execute()


def give_back(connection: Redis, taking: str, job_id: str) -> bool:
    """Move a job from the taking list `taking` back to the front of its queue, waking its
    workers, if it is still in the list and still queued (GIVE_BACK); whether it went back."""
    origin = connection.hget(Job.key_for(job_id), "origin")
    if origin is None:   # deleted meanwhile: it only leaves the list
        connection.lrem(taking, 1, job_id)
        return False
    queue = Queue(origin.decode(), connection=connection)
    keys = [taking, Job.key_for(job_id), queue.key, protocol.wake_key(queue.name)]
    return bool(connection.register_script(GIVE_BACK)(keys=keys, args=[job_id, WAKE]))
