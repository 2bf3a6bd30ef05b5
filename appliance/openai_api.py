"""OpenAI-compatible endpoints. They go through the same queue as REST jobs: a request is a job,
and the response (whole or streamed as chunks) is read from the job's stream."""
import json
import select
import socket
import time

from flask import Blueprint, Response, request, stream_with_context

from appliance import auth, limits, queue, requestbody, schema
from vkllm import protocol

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
    return parse(requestbody.read(), chat)


def parse(body: dict, chat: bool) -> tuple[dict, dict]:
    """A request body as the endpoint reads it (also each line of a batch): the body with
    OpenAI's defaults applied, and the generation it asks for."""
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise schema.Invalid("only n=1 is supported", "n")
    if not isinstance(body.get("stream", False), bool | None):
        raise schema.Invalid("stream must be true or false", "stream")
    options = body.get("stream_options")
    if options is not None and not (isinstance(options, dict)
                                    and isinstance(options.get("include_usage", False), bool)):
        raise schema.Invalid("stream_options must be an object like {\"include_usage\": true}", "stream_options")
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
    status = {"invalid_request": 400, "unavailable": 503}.get(data.get("kind"), 500)
    kind = "invalid_request_error" if status == 400 else "server_error"
    return {"error": {"message": data["error"], "type": kind, "param": None, "code": None}}, status


def _client_gone() -> bool:
    """Whether the client closed its connection while waiting for a whole response. Its request
    was read in full, so a readable socket that yields no byte has reached its end (one with
    bytes holds a pipelined next request)."""
    sock = request.environ.get("gunicorn.socket") or request.environ.get("werkzeug.socket")
    if sock is None:
        return False
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    if not poller.poll(0):
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except ValueError:   # a TLS socket takes no flags: no way to tell, so keep waiting
        return False
    except OSError:      # reset by the peer
        return True


CLIENT_CHECK_INTERVAL = 1.0   # seconds between looks at a waiting client's connection


def _respond(chat: bool):
    body, gen = _request(chat)
    limits.admit(gen["model"])
    job_id, _ = queue.submit(gen, priority="normal", metadata={}, kind="chat" if chat else "completion")
    head = {"id": ("chatcmpl-" if chat else "cmpl-") + job_id, "created": int(time.time()), "model": gen["model"]}
    if body.get("stream"):
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return _stream(job_id, head, chat, include_usage)
    text, end, next_check = [], None, time.monotonic() + CLIENT_CHECK_INTERVAL
    for record in queue.follow(job_id, block_ms=int(CLIENT_CHECK_INTERVAL * 1000)):
        if time.monotonic() >= next_check:
            next_check = time.monotonic() + CLIENT_CHECK_INTERVAL
            if _client_gone():   # nobody will read the answer: free the GPU
                job = queue.fetch(job_id)
                if job is not None:
                    queue.cancel(job)
                return "", 499   # nginx's "client closed request", for the access log
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
