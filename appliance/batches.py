"""OpenAI's Batch API: create a batch from an uploaded JSONL file of requests, read it, list
batches (cursor pagination: after, limit, has_more), cancel one. Records are in batchstore, the
work in batchwork."""
import threading

from flask import Blueprint, request

from appliance import auth, batchstore, batchwork, filestore, requestbody
from appliance.schema import Invalid

bp = Blueprint("batches", __name__, url_prefix="/v1/batches")
bp.before_request(auth.require_key)

MAX_METADATA_PAIRS, MAX_KEY, MAX_VALUE = 16, 64, 512   # OpenAI's bounds on metadata


def init_app(app) -> None:
    """Every web process sweeps the open batches, so they move on whichever process is up."""
    interval = app.config["BATCH_SWEEP_INTERVAL"]
    if interval:
        threading.Thread(target=batchwork.sweep, args=(app, interval), name="vkllm-batch-sweep",
                         daemon=True).start()


def _found(batch: dict | None, batch_id: str) -> dict:
    if batch is None:
        raise Invalid(f"no batch {batch_id!r}", "batch_id", 404, "batch_not_found")
    return batch


@bp.post("")
def create():
    body = requestbody.read()
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str) or filestore.get(file_id) is None:
        raise Invalid(f"input_file_id must name an uploaded file, got {file_id!r}", "input_file_id", 400,
                      "file_not_found")
    endpoint = body.get("endpoint")
    if endpoint not in batchstore.ENDPOINTS:
        raise Invalid(f"endpoint must be one of {list(batchstore.ENDPOINTS)}, got {endpoint!r}", "endpoint")
    window = body.get("completion_window")
    if window not in batchstore.WINDOWS:
        raise Invalid(f"completion_window must be one of {list(batchstore.WINDOWS)}, got {window!r}",
                      "completion_window")
    metadata = body.get("metadata")
    if metadata is not None and not (
            isinstance(metadata, dict) and len(metadata) <= MAX_METADATA_PAIRS
            and all(isinstance(k, str) and len(k) <= MAX_KEY and isinstance(v, str) and len(v) <= MAX_VALUE
                    for k, v in metadata.items())):
        raise Invalid(f"metadata must be an object of at most {MAX_METADATA_PAIRS} string pairs (keys up to "
                      f"{MAX_KEY} characters, values up to {MAX_VALUE})", "metadata")
    batch = batchstore.create(file_id, endpoint, window, metadata)
    batchwork.kick(batch["id"])
    return batch


@bp.get("")
def listing():
    try:
        limit = int(request.args.get("limit", 20))
    except ValueError:
        raise Invalid("limit must be an integer", "limit") from None
    if not 1 <= limit <= 100:
        raise Invalid("limit must be between 1 and 100", "limit")
    data, more = batchwork.listing(request.args.get("after"), limit)
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}


@bp.get("/<batch_id>")
def retrieve(batch_id):
    return _found(batchwork.current(batch_id), batch_id)


@bp.post("/<batch_id>/cancel")
def cancel(batch_id):
    return _found(batchwork.cancel(batch_id), batch_id)
