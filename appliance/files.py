"""OpenAI's Files API, for the Batch API: upload a JSONL file of requests (purpose "batch"), read
a file's record, download its content (also the output and error files of batches), list, delete."""
import errno

from flask import Blueprint, current_app, request, send_file

from appliance import auth, filestore
from appliance.schema import Invalid

bp = Blueprint("files", __name__, url_prefix="/v1/files")
bp.before_request(auth.require_key)

MULTIPART_OVERHEAD = 64 * 1024   # bytes of a multipart body besides the file: boundaries, the purpose field
COPY_CHUNK = 1024 * 1024


def found(file_id: str) -> dict:
    record = filestore.get(file_id)
    if record is None:
        raise Invalid(f"no file {file_id!r}", "file_id", 404, "file_not_found")
    return record


@bp.post("")
def upload():
    cfg = current_app.config
    most = cfg["MAX_FILE_BYTES"]
    if request.content_length is not None and request.content_length > most + MULTIPART_OVERHEAD:
        raise Invalid(f"the upload is {request.content_length} bytes; files are limited to {most} bytes", "file",
                      413, "file_too_large")
    request.max_content_length = most + MULTIPART_OVERHEAD   # also for a body of unstated length
    purpose = request.form.get("purpose")
    if purpose not in filestore.PURPOSES:
        raise Invalid(f"purpose must be one of {list(filestore.PURPOSES)}, got {purpose!r}", "purpose")
    upload = request.files.get("file")
    if upload is None:
        raise Invalid("the multipart field 'file' is required", "file")
    try:
        return filestore.add(filestore.new_id(), upload.filename or "upload.jsonl", purpose,
                             lambda out: _copy(upload.stream, out, most, cfg["MAX_BATCH_LINES"]))
    except OSError as e:   # the data volume full, read-only or gone: the operator's to mend
        current_app.logger.error("an upload could not be stored in %s/files: %s", current_app.config["DATA_DIR"], e)
        full = e.errno in (errno.ENOSPC, errno.EDQUOT)
        raise Invalid(f"the file could not be stored: {e.strerror}", None, 507 if full else 503,
                      "storage_full" if full else "storage_unavailable") from None


def _copy(source, out, most_bytes: int, most_lines: int) -> None:
    """Copy the upload, refusing it as soon as it is over either limit."""
    size = lines = 0
    last = b"\n"
    while chunk := source.read(COPY_CHUNK):
        size += len(chunk)
        lines += chunk.count(b"\n")
        last = chunk[-1:]
        if size > most_bytes:
            raise Invalid(f"the file is over {most_bytes} bytes, the most a file may have", "file", 413,
                          "file_too_large")
        out.write(chunk)
    lines += last != b"\n"   # a last line without its newline
    if lines > most_lines:
        raise Invalid(f"the file has {lines} lines; a batch may have at most {most_lines} requests", "file", 400,
                      "too_many_lines")
    if size == 0:
        raise Invalid("the file is empty", "file")


@bp.get("")
def listing():
    try:
        limit = int(request.args.get("limit", 10000))
    except ValueError:
        raise Invalid("limit must be an integer", "limit") from None
    if not 1 <= limit <= 10000:
        raise Invalid("limit must be between 1 and 10000", "limit")
    data, more = filestore.listing(request.args.get("after"), limit, request.args.get("purpose"))
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}


@bp.get("/<file_id>")
def record(file_id):
    return found(file_id)


@bp.get("/<file_id>/content")
def content(file_id):
    record = found(file_id)
    if not filestore.path(file_id).is_file():
        raise Invalid(f"the content of {file_id} is missing from the data folder", "file_id", 404, "file_not_found")
    return send_file(filestore.path(file_id), mimetype="application/octet-stream", download_name=record["filename"])


@bp.delete("/<file_id>")
def delete(file_id):
    found(file_id)
    filestore.delete(file_id)
    return {"id": file_id, "object": "file", "deleted": True}
