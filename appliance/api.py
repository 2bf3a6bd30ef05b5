"""REST v1: submit, list, read, stream and cancel jobs; count prompt tokens; the served models."""
import json
import re

from flask import Blueprint, Response, jsonify, request, stream_with_context, url_for

from appliance import auth, limits, queue, requestbody, schema
from appliance.openapi import document

bp = Blueprint("api", __name__, url_prefix="/api/v1")
bp.before_request(auth.require_key)


EVENT_ID = re.compile(r"(\d{1,20})-(\d{1,20})")   # a Redis stream entry id, as the stream sends them


def _body() -> dict:
    return requestbody.read()


def _job(job_id: str):
    job = queue.fetch(job_id)
    if job is None:
        raise schema.Invalid(f"no job {job_id!r} (never submitted, or expired)", "id", 404, "job_not_found")
    return job


@bp.post("/jobs")
def submit():
    body = _body()
    gen = schema.generation(body, chat=None)
    priority, metadata = schema.job_options(body)
    limits.admit(gen["model"])
    job_id, position = queue.submit(gen, priority=priority, metadata=metadata, kind="rest")
    response = jsonify({"id": job_id, "object": "job", "state": "queued", "queue_position": position,
                        "params": gen["params"], "url": url_for(".job", job_id=job_id),
                        "stream_url": url_for(".stream", job_id=job_id)})
    response.status_code = 202
    response.headers["Location"] = url_for(".job", job_id=job_id)
    return response


@bp.get("/jobs")
def jobs():
    state, offset, limit = schema.page(request.args)
    views, total = queue.list_jobs(state, offset, limit)
    return {"object": "list", "data": views, "total": total, "offset": offset, "limit": limit}


@bp.get("/jobs/<job_id>")
def job(job_id):
    return queue.describe(_job(job_id))


def sse(records) -> Response:
    """Server-Sent Events from (id, type, data) records; None becomes a keep-alive comment."""
    def lines():
        for record in records:
            if record is None:
                yield ": keep-alive\n\n"
            else:
                eid, kind, data = record
                yield f"id: {eid}\nevent: {kind}\ndata: {json.dumps(data)}\n\n"
    return Response(stream_with_context(lines()), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@bp.get("/jobs/<job_id>/stream")
def stream(job_id):
    """Replays the job's stream from the start, or after Last-Event-ID, then follows it live."""
    _job(job_id)
    after = _resume_after(job_id)
    return sse(queue.follow(job_id, after)) if after is not None else Response(status=204)


def _resume_after(job_id: str) -> str | None:
    """The stream entry a reconnecting client saw last ("-": none); None when that was the
    stream's end or error record: nothing is left to send, and 204 tells EventSource to stop
    reconnecting. An id past the stream's end (from another server, or made up) replays the
    stream from the start: following from there would answer an empty 200, and EventSource
    would reconnect with it forever."""
    raw = (request.headers.get("Last-Event-ID") or request.args.get("last_event_id") or "").strip() or "-"
    if raw == "-":
        return raw
    parsed = EVENT_ID.fullmatch(raw)
    if parsed is None or any(int(part) >= 2**64 for part in parsed.groups()):
        raise schema.Invalid(f"Last-Event-ID must be an event id from this job's stream (like 1700000000000-0), "
                             f"got {raw[:40]!r}", "Last-Event-ID")
    seen, last = tuple(int(p) for p in parsed.groups()), queue.last_event(job_id)
    if last is None or seen > last[0]:
        return "-"
    return None if seen == last[0] and last[1] else raw


@bp.post("/jobs/<job_id>/cancel")
def cancel(job_id):
    job = _job(job_id)
    state = queue.cancel(job)
    return {"id": job_id, "object": "job", "state": state,
            "cancel_requested": state == "running"}, 202 if state == "running" else 200


@bp.post("/tokenize")
def tokenize():
    """The prompt's (or chat's) length in tokens, as the model's worker counts it before a job."""
    model, n_ctx, prompt = schema.tokenize(_body())
    tokens = schema.prompt_tokens(model, prompt)
    if tokens is None:
        raise schema.Invalid(f"no worker serving {model} answered in time; try again", None, 503,
                             "worker_timeout")
    return {"model": model, "tokens": tokens, "n_ctx": n_ctx}


@bp.get("/models")
def models():
    return {"object": "list", "data": list(queue.models().values())}


@bp.get("/openapi.json")
def openapi():
    return document()
