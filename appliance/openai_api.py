"""OpenAI-compatible endpoints. They go through the same queue as REST jobs: a request is a job,
and the response (whole or streamed as chunks) is read from the job's stream."""
import json
import time

from flask import Blueprint, Response, request, stream_with_context

from appliance import auth, protocol, queue, schema

bp = Blueprint("openai", __name__, url_prefix="/v1")
bp.before_request(auth.require_key)

# OpenAI clients know stop and length only; a cancelled generation stopped.
FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}


@bp.get("/models")
def models():
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "vkllm",
                                        "context_length": m["n_ctx"],
                                        "sampling_defaults": m.get("sampling_defaults")}
                                       for name, m in queue.models().items()]}


def _request(chat: bool) -> tuple[dict, dict]:
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise schema.Invalid("the body must be a JSON object (Content-Type: application/json)")
    if body.get("n", 1) != 1:
        raise schema.Invalid("only n=1 is supported", "n")
    if chat and body.get("max_completion_tokens") is not None:
        body = body | {"max_tokens": body["max_completion_tokens"]}
    if not chat and isinstance(body.get("prompt"), list) and len(body["prompt"]) == 1:
        body = body | {"prompt": body["prompt"][0]}
    if not chat and body.get("max_tokens") is None:
        body = body | {"max_tokens": 16}   # OpenAI's default for completions
    return body, schema.generation(body, chat=chat)


def _usage(end: dict) -> dict | None:
    usage = end.get("usage")
    if not usage:
        return None
    return usage | {"total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}


def _failure(data: dict) -> tuple[dict, int]:
    status = 400 if data.get("kind") == "invalid_request" else 500
    kind = "invalid_request_error" if status == 400 else "server_error"
    return {"error": {"message": data["error"], "type": kind, "param": None, "code": None}}, status


def _respond(chat: bool):
    body, gen = _request(chat)
    job_id, _ = queue.submit(gen, priority="normal", metadata={}, kind="chat" if chat else "completion")
    head = {"id": ("chatcmpl-" if chat else "cmpl-") + job_id, "created": int(time.time()), "model": gen["model"]}
    if body.get("stream"):
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return _stream(job_id, head, chat, include_usage)
    text, end = [], None
    for record in queue.follow(job_id):
        if record is None:
            continue
        _, kind, data = record
        if kind == protocol.ERROR:
            return _failure(data)
        if kind == protocol.TOKEN:
            text.append(data["text"])
        end = data
    finish = FINISH[end["finish_reason"]]
    choice = ({"index": 0, "message": {"role": "assistant", "content": "".join(text)}} if chat
              else {"index": 0, "text": "".join(text)}) | {"logprobs": None, "finish_reason": finish}
    return head | {"object": "chat.completion" if chat else "text_completion", "choices": [choice],
                   "usage": _usage(end)}


def _stream(job_id: str, head: dict, chat: bool, include_usage: bool) -> Response:
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, finish: str | None, first: bool = False) -> str:
        if chat:
            delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text is not None else {})
            choice = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text or ""}
        body = head | {"object": obj, "choices": [choice | {"logprobs": None, "finish_reason": finish}]}
        return f"data: {json.dumps(body)}\n\n"

    def events():
        finished = False
        try:
            yield chunk("", None, first=True)
            for record in queue.follow(job_id):
                if record is None:
                    yield ": keep-alive\n\n"
                    continue
                _, kind, data = record
                if kind == protocol.TOKEN:
                    yield chunk(data["text"], None)
                elif kind == protocol.ERROR:
                    yield f"data: {json.dumps(_failure(data)[0])}\n\n"
                else:
                    yield chunk(None, FINISH[data["finish_reason"]])
                    if include_usage:
                        yield f"data: {json.dumps(head | {'object': obj, 'choices': [], 'usage': _usage(data)})}\n\n"
            finished = True
            yield "data: [DONE]\n\n"
        finally:
            if not finished:   # the client went away: free the GPU
                job = queue.fetch(job_id)
                if job is not None:
                    queue.cancel(job)

    return Response(stream_with_context(events()), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@bp.post("/completions")
def completions():
    return _respond(chat=False)


@bp.post("/chat/completions")
def chat_completions():
    return _respond(chat=True)
