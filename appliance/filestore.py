"""Files of the Batch API: their bytes in one folder on the data volume (DATA_DIR/files, DATA_DIR set
once in create_app), their records (name, size, purpose, creation time) in Redis, so that every web process
sees the same files and a restart loses none. Written to a temporary name and renamed, so a file
is either whole or absent."""
import os
import time
import uuid
from pathlib import Path

from flask import current_app

from appliance.queue import get_redis
from vkllm import protocol

PURPOSES = ("batch",)   # what clients may upload; batch_output is what the appliance writes


def folder() -> Path:
    path = Path(current_app.config["DATA_DIR"]) / "files"
    path.mkdir(parents=True, exist_ok=True)
    return path


def path(file_id: str) -> Path:
    return folder() / file_id


def new_id() -> str:
    return f"file-{uuid.uuid4().hex}"


def add(file_id: str, filename: str, purpose: str, write) -> dict:
    """Store a file whose bytes write(open binary file) puts down; returns its record."""
    target = path(file_id)
    partial = target.with_name(f".{file_id}.partial")
    try:
        with open(partial, "wb") as out:
            write(out)
            out.flush()
            os.fsync(out.fileno())
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    record = {"id": file_id, "object": "file", "bytes": target.stat().st_size, "created_at": int(time.time()),
              "filename": filename, "purpose": purpose, "status": "processed", "expires_at": None,
              "status_details": None}
    r = get_redis()
    with r.pipeline() as pipe:
        pipe.hset(protocol.file_key(file_id), mapping={k: v for k, v in record.items() if v is not None})
        pipe.zadd(protocol.FILES, {file_id: time.time()})
        pipe.execute()
    return record


def get(file_id: str) -> dict | None:
    raw = get_redis().hgetall(protocol.file_key(file_id))
    if not raw:
        return None
    record = {k.decode(): v.decode() for k, v in raw.items()}
    for name in ("bytes", "created_at"):
        record[name] = int(record[name])
    return record | {"expires_at": None, "status_details": None}


def listing(after: str | None, limit: int, purpose: str | None) -> tuple[list[dict], bool]:
    """Newest first, the page after file id `after`; whether more follow."""
    records = [f for f in (get(i.decode()) for i in get_redis().zrevrange(protocol.FILES, 0, -1)) if f]
    if purpose:
        records = [f for f in records if f["purpose"] == purpose]
    ids = [f["id"] for f in records]
    start = ids.index(after) + 1 if after in ids else 0
    return records[start:start + limit], start + limit < len(records)


def delete(file_id: str) -> bool:
    r = get_redis()
    with r.pipeline() as pipe:
        pipe.delete(protocol.file_key(file_id))
        pipe.zrem(protocol.FILES, file_id)
        found = pipe.execute()[0]
    path(file_id).unlink(missing_ok=True)
    return bool(found)
