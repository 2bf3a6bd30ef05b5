"""The lines of a batch: reading its input file ({"custom_id", "method", "url", "body"} per line,
blank lines skipped), and making each request's line of the output or error file, in OpenAI's
batch output format: {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}."""
import json
from dataclasses import dataclass

from appliance import batchstore, filestore, openai_api, queue
from appliance.batchstore import ENDPOINTS
from vkllm import protocol

CHUNK = 500   # jobs read per round trip


@dataclass(frozen=True)
class Line:
    number: int        # 0-based, among the file's requests
    custom_id: str
    body: dict
    model: str | None


def read_lines(batch: dict, most: int) -> tuple[list[Line], list[dict]]:
    """The input file's requests, or the errors that keep the batch from running (OpenAI's
    validation: the whole file is refused, each error naming its 1-based line)."""
    file_id = batch["input_file_id"]
    record = filestore.get(file_id)
    if record is None or not filestore.path(file_id).is_file():
        return [], [_error("file_not_found", f"the input file {file_id} does not exist", "input_file_id")]
    if record["purpose"] != "batch":
        return [], [_error("invalid_file", f"the input file's purpose is {record['purpose']!r}, not 'batch'",
                           "input_file_id")]
    lines, errors, seen = [], [], set()
    with open(filestore.path(file_id), "rb") as f:
        for at, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            found = _line(raw, len(lines), batch["endpoint"], seen)
            if isinstance(found, Line):
                lines.append(found)
                seen.add(found.custom_id)
            else:
                errors.append(_error(*found, line=at))
    if not lines and not errors:
        errors.append(_error("empty_file", "the input file holds no request", "input_file_id"))
    if len(lines) > most:
        errors.insert(0, _error("too_many_requests", f"the file has {len(lines)} requests; a batch may have at "
                                f"most {most}", "input_file_id"))
    return lines, errors


def _line(raw: bytes, number: int, endpoint: str, seen: set) -> Line | tuple[str, str, str | None]:
    try:
        item = json.loads(raw)
    except RecursionError:   # nesting beyond Python's recursion limit
        return "invalid_json_line", "the line nests too deep", None
    except ValueError as e:
        return "invalid_json_line", f"the line is not JSON: {e}", None
    if not isinstance(item, dict):
        return "invalid_request", "the line must be a JSON object", None
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return "missing_custom_id", "custom_id (a non-empty string) is required", "custom_id"
    if custom_id in seen:
        return "duplicate_custom_id", f"custom_id {custom_id!r} is on another line too", "custom_id"
    if item.get("method") != "POST":
        return "invalid_method", "method must be POST", "method"
    if item.get("url") != endpoint:
        return "mismatched_url", f"url must be the batch's endpoint {endpoint}, got {item.get('url')!r}", "url"
    body = item.get("body")
    if not isinstance(body, dict):
        return "invalid_body", "body must be a JSON object", "body"
    model = body.get("model")
    return Line(number, custom_id, body, model if isinstance(model, str) else None)


def _error(code: str, message: str, param: str | None, line: int | None = None) -> dict:
    return {"code": code, "message": message, "param": param, "line": line}


def result_lines(batch: dict, renew):
    """(whether it succeeded, its output line) for each request, in input order."""
    r, batch_id = queue.get_redis(), batch["id"]
    rejected = {int(k): json.loads(v) for k, v in r.hgetall(protocol.batch_rejected_key(batch_id)).items()}
    custom_ids = {line.number: line.custom_id for line in read_lines(batch, batch["lines"])[0]}
    many = batchstore.choices(batch_id)
    for start in range(0, batch["lines"], CHUNK):
        renew(batch_id)
        numbers = range(start, min(start + CHUNK, batch["lines"]))
        ids = batchstore.line_jobs(batch_id, numbers, many)
        found = iter(queue.fetch_many([job_id for line in ids for job_id in line]))
        for i, line in zip(numbers, ids):
            jobs = [next(found) for _ in line]
            if i in rejected:
                yield False, rejected[i]
                continue
            custom_id = custom_ids.get(i) or next((j.meta["metadata"]["custom_id"] for j in jobs if j), None)
            yield _result(batch, line[0], custom_id, jobs)


def _result(batch: dict, job_id: str, custom_id: str | None, jobs: list) -> tuple[bool, dict]:
    """A line's output line from its jobs (one per choice)."""
    line = {"id": f"batch_req_{job_id}", "custom_id": custom_id}
    st = batchstore.line_state([queue.state(job) if job else None for job in jobs])
    if st == "finished":
        results = [job.return_value() for job in jobs]
        if all(result and result["finish_reason"] != "cancelled" for result in results):
            return True, line | {"response": {"status_code": 200, "request_id": job_id,
                                              "body": _completion(batch, jobs, results)}, "error": None}
        st = "cancelled"   # stopped by the cancel, not yet filed as cancelled by its worker
    if st == "failed":
        job = next(job for job in jobs if job and queue.state(job) == "failed")
        errors = [d for _, kind, d in queue.stream_records(job.id) if kind == protocol.ERROR]
        kind = errors[-1].get("kind") if errors else None
        message = errors[-1]["error"] if errors else queue.describe(job, with_output=False)["error"]
        status = 400 if kind == "invalid_request" else 500
        body = {"error": {"message": message, "type": "invalid_request_error" if status == 400 else "server_error",
                          "param": None, "code": None}}
        return False, line | {"response": {"status_code": status, "request_id": job_id, "body": body}, "error": None}
    if batch["stop"] == "expired":
        error = {"code": "batch_expired",
                 "message": "This request could not be executed before the completion window expired."}
    elif st is None and not batch["stop"]:
        error = {"code": "job_expired", "message": "the request's job record expired before the batch ended"}
    else:
        error = {"code": "batch_cancelled", "message": "This request was cancelled before it completed."}
    return False, line | {"response": None, "error": error}


def _completion(batch: dict, jobs: list, results: list[dict]) -> dict:
    """The response body the request's endpoint would have answered (openai_api.response): each
    choice's end record is its job's result; its tokens, where logprobs were asked, are its
    stream's records, else its whole text."""
    chat, gen, first = ENDPOINTS[batch["endpoint"]], jobs[0].kwargs["request"], jobs[0]
    choices = []
    for job, result in zip(jobs, results):
        tokens = ([d for _, kind, d in queue.stream_records(job.id) if kind == protocol.TOKEN]
                  if "logprobs" in gen else [{"text": result["text"]}])
        choices.append((tokens, result))
    head = {"id": ("chatcmpl-" if chat else "cmpl-") + first.id,
            "created": int((first.ended_at or first.created_at).timestamp()), "model": first.meta["model"]}
    return openai_api.response(head, chat, gen, choices)
