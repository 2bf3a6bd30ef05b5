"""The Redis contract between the web app and the GPU workers: key names and stream records.

Both sides import this module; it needs only the standard library, so the worker can use it
without Flask and the web app without the engine. A key spelled here is spelled nowhere else."""
import json

JOB_FUNCTION = "worker.service.worker.run_job"   # RQ imports it by name, only inside the worker
WORKERS = "vkllm:workers"                 # set of worker names that registered once
JOBS = "vkllm:jobs"                       # sorted set: job id -> submit time, for listings
# hash: model name -> JSON of what its workers last published (n_ctx, info, max_token_bytes): the
# models this appliance serves, also while none of their workers is up (their jobs then wait)
MODELS = "vkllm:models"
API_KEY_HASH = "vkllm:api_key_sha256"
SECRET_KEY = "vkllm:secret_key"           # Flask session key shared by all web processes


def queue_name(model: str) -> str:
    """One RQ queue per model, so a worker only takes jobs for models it holds."""
    return f"vkllm:{model}"


def stream_key(job_id: str) -> str:
    return f"vkllm:stream:{job_id}"


def cancel_key(job_id: str) -> str:
    return f"vkllm:cancel:{job_id}"


def session_key(session_id: str) -> str:
    """An admin UI session: the SHA-256 of the API key it was opened with, with the session's TTL."""
    return f"vkllm:session:{session_id}"


def login_failures_key(address: str) -> str:
    return f"vkllm:login-failures:{address}"


def rate_key(key_generation: str, minute: int) -> str:
    """Jobs submitted with one API key in one minute (since the epoch)."""
    return f"vkllm:rate:{key_generation[:16]}:{minute}"


def tokenize_key(model: str) -> str:
    """List of token-count requests for a model, answered by any worker serving it. A request is
    JSON {"reply": key, "prompt": text} or {"reply": key, "messages": [...], "tools"?: [...]}; the reply, pushed to
    its key, is JSON {"tokens": n} or {"error": message} (a chat its template refuses)."""
    return f"vkllm:tokenize:{model}"


def tokenize_reply_key(request_id: str) -> str:
    return f"vkllm:tokenize-reply:{request_id}"


TOKENIZE_REPLY_TTL = 10   # seconds a reply waits for an asker that may have given up


def worker_key(name: str) -> str:
    """Hash a live worker refreshes with a short TTL: its models, device stats, metrics port."""
    return f"vkllm:worker:{name}"


def orphan_key(job_id: str) -> str:
    """When a sweep first found the job's worker gone (vkllm.orphans); the worker deletes it."""
    return f"vkllm:orphan:{job_id}"


def sweep_lock_key(queue_name: str) -> str:
    """Held by the one sweeper of a queue's orphaned jobs (vkllm.orphans), briefly."""
    return f"vkllm:sweep-lock:{queue_name}"


def wake_key(queue_name: str) -> str:
    """List of wake-up tokens of a queue: every push of a job onto the queue pushes one
    (vkllm.jobqueue), and an idle worker blocks on its queues' lists (worker/service/taking.py)."""
    return f"vkllm:wake:{queue_name}"


# A job a worker has taken from its queue but not yet started (not yet in RQ's started registry)
# waits in that worker start's taking list; if the worker dies first, the watchdog (vkllm.orphans)
# puts it back at the front of its queue. A worker start's instance (a uuid) names its list.
TAKERS = "vkllm:takers"                   # hash: instance -> JSON {"worker": name, "liveness_ttl": s}
TAKERS_SWEEP_LOCK = "vkllm:sweep-lock:takers"


def taking_key(instance: str) -> str:
    """List of the job ids a worker start has taken from their queues and not yet started."""
    return f"vkllm:taking:{instance}"


def taker_gone_key(instance: str) -> str:
    """When a sweep first found a taker's worker gone (vkllm.orphans); the worker deletes it."""
    return f"vkllm:taker-gone:{instance}"


# Stream records: field "type" is one of these, field "data" a JSON object. A token's data is
# {"text"} with "logprobs" (OpenAI's chat entry) when the job asked for them; the end's is
# {"finish_reason", "usage", "timings"} with "tool_calls" (OpenAI's shape) when the model made any.
TOKEN, END, ERROR = "token", "end", "error"


def record(record_type: str, /, **data) -> dict:
    return {"type": record_type, "data": json.dumps(data)}


def parse(fields: dict) -> tuple[str, dict]:
    """Decode a stream entry's fields (bytes or str) into (type, data)."""
    get = {(k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()}
    kind, data = get["type"], get["data"]
    kind = kind.decode() if isinstance(kind, bytes) else kind
    return kind, json.loads(data)


def batch_queue_name(model: str) -> str:
    """The queue of a model's batch lines: workers take from it only when every interactive queue
    they serve is empty (RQ takes queues in the order given), so interactive requests go first."""
    return f"vkllm-batch:{model}"


# The Batch API (OpenAI's): uploaded and generated files, and batches of queued jobs.
FILES = "vkllm:files"                     # sorted set: file id -> upload time, for listings
BATCHES = "vkllm:batches"                 # sorted set: batch id -> creation time, for listings
OPEN_BATCHES = "vkllm:batches:open"       # sorted set of the batches not yet ended, for the sweep


def file_key(file_id: str) -> str:
    """Hash: a file's record (name, size, purpose, creation time); its bytes are on the data volume."""
    return f"vkllm:file:{file_id}"


def batch_key(batch_id: str) -> str:
    """Hash: a batch's fields, each JSON (status, timestamps, request counts, file ids, lines)."""
    return f"vkllm:batch:{batch_id}"


def batch_rejected_key(batch_id: str) -> str:
    """Hash: input line number -> JSON of its error-file line, for lines refused before queueing."""
    return f"vkllm:batch-rejected:{batch_id}"


def batch_lock_key(batch_id: str) -> str:
    """Held by the one web process that advances the batch (validates, cancels, finalizes)."""
    return f"vkllm:batch-lock:{batch_id}"


def batch_choices_key(batch_id: str) -> str:
    """Hash: input line number -> n, for the lines whose request asks for n > 1 choices."""
    return f"vkllm:batch-choices:{batch_id}"


def batch_job_id(batch_id: str, line: int, choice: int = 0) -> str:
    """The job of an input line (0-based), or of its choice (a request with n > 1 is a job per
    choice): known without a lookup, so a validation cut short by a restart resumes where it
    stopped and a finalization reads every line's jobs by their numbers."""
    return f"{batch_id}-{line}" if choice == 0 else f"{batch_id}-{line}-{choice}"
