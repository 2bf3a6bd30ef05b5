"""OpenAI-compatible endpoints. They go through the same queue as REST jobs: a request is a job,
and the response (whole or streamed as chunks) is read from the job's stream."""
import codecs
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
MAX_N = 8                # choices a request may ask for, each a job of its own
MAX_PROMPTS = 64         # prompts one completions request may list (n choices each)
MAX_TOP_LOGPROBS = 20    # OpenAI's limit for chat (5 for completions; vLLM allows 20 on both)
# OpenAI parameters this server does not implement, with the values that ask for nothing (clients
# send some of them by default): any other value is refused rather than silently ignored.
NOT_IMPLEMENTED = {"logit_bias": {}, "echo": False, "suffix": ""}
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512   # OpenAI's limits on metadata


def _model(name: str, m: dict) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "vkllm", "context_length": m["n_ctx"],
            "sampling_defaults": m.get("sampling_defaults")}


@bp.get("/models")
def models():
    return {"object": "list", "data": [_model(name, m) for name, m in queue.models().items()]}


@bp.get("/models/<path:model>")
def model(model: str):
    """One entry of the listing (the openai client's models.retrieve)."""
    served = queue.models()
    if model not in served:
        raise schema.Invalid(f"unknown model {model!r}; served now: {sorted(served) or 'none'}", "model", 404,
                             "model_not_found")
    return _model(model, served[model])


def _prompts(body: dict, chat: bool) -> list[dict]:
    """A request as one body per prompt: a completions prompt may be a list of strings (OpenAI's
    batched prompt), each answered by n choices, prompt after prompt."""
    prompt = body.get("prompt")
    if chat or not isinstance(prompt, list) or len(prompt) == 1:
        return [body]
    if not prompt or len(prompt) > MAX_PROMPTS or not all(isinstance(p, str) for p in prompt):
        raise schema.Invalid(f"prompt must be a string or a list of at most {MAX_PROMPTS} strings "
                             f"(token ids are not supported)", "prompt")
    return [body | {"prompt": p} for p in prompt]


def parse(body: dict, chat: bool) -> tuple[dict, dict, int]:
    """A request body as the endpoint reads it (also each line of a batch): the body with
    OpenAI's defaults applied, the job's request (with "logprobs": the alternatives per token,
    when asked) and n."""
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N):
        raise schema.Invalid(f"n must be an integer between 1 and {MAX_N}", "n")
    for param, nothing in NOT_IMPLEMENTED.items():
        value = body.get(param)
        if value is not None and (type(value) is not type(nothing) or value != nothing):
            raise schema.Invalid(f"{param} is not supported by this server (leave it out)", param)
    best_of = body.get("best_of")
    if best_of is not None and (best_of is True or best_of != (n or 1)):
        raise schema.Invalid("best_of is not supported by this server (leave it out, or equal to n)", "best_of")
    _user_and_metadata(body)
    if not isinstance(body.get("stream", False), bool | None):
        raise schema.Invalid("stream must be true or false", "stream")
    options = body.get("stream_options")
    if options is not None and not (isinstance(options, dict)
                                    and isinstance(options.get("include_usage", False), bool)):
        raise schema.Invalid("stream_options must be an object like {\"include_usage\": true}", "stream_options")
    if not chat and isinstance(body.get("prompt"), list) and len(body["prompt"]) == 1:
        body = body | {"prompt": body["prompt"][0]}
    if not chat and body.get("max_tokens") is None:
        body = body | {"max_tokens": 16}   # OpenAI's default for completions
    gen = schema.generation(body, chat=chat)
    top = _logprobs(body, chat)
    return body, gen | ({"logprobs": top} if top is not None else {}), n or 1


def _user_and_metadata(body: dict) -> None:
    """OpenAI's user (a string, for abuse monitoring: unused here) and metadata (string values,
    kept with the job as a REST job's metadata is), within OpenAI's limits."""
    if not isinstance(body.get("user"), str | None):
        raise schema.Invalid("user must be a string", "user")
    metadata = body.get("metadata")
    if metadata is not None and not (
            isinstance(metadata, dict) and len(metadata) <= METADATA_PAIRS
            and all(len(k) <= METADATA_KEY and isinstance(v, str) and len(v) <= METADATA_VALUE
                    for k, v in metadata.items())):
        raise schema.Invalid(f"metadata must be an object of at most {METADATA_PAIRS} string values (keys up to "
                             f"{METADATA_KEY} characters, values up to {METADATA_VALUE})", "metadata")


def _top_count(value, param: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise schema.Invalid(f"{param} must be an integer between 0 and {MAX_TOP_LOGPROBS}", param)
    return value


def _logprobs(body: dict, chat: bool) -> int | None:
    """How many alternatives each token's logprobs list; None: no logprobs. Chat asks with
    logprobs: true and top_logprobs: k, completions with logprobs: k."""
    if not chat:
        return None if body.get("logprobs") is None else _top_count(body["logprobs"], "logprobs")
    want, top = body.get("logprobs"), body.get("top_logprobs")
    if not isinstance(want, bool | None):
        raise schema.Invalid("logprobs must be true or false", "logprobs")
    if top is not None and not want and (type(top) is not int or top != 0):   # 0 asks for nothing: accepted
        raise schema.Invalid("top_logprobs needs logprobs: true", "top_logprobs")
    return _top_count(top or 0, "top_logprobs") if want else None


def sequences(gen: dict, n: int) -> list[dict]:
    """n independent generations of one request. A seeded request stays reproducible and its
    choices still differ: choice i draws with seed + i."""
    seed = gen["params"].get("seed")
    return [gen if i == 0 or seed is None else gen | {"params": gen["params"] | {"seed": (seed + i) % 2**64}}
            for i in range(n)]


def _usage(ends: list[dict], n: int) -> dict:
    """Prompts of n completions each (their ends in that order), each prompt counted once; zeros
    for a job that ended before it ran (cancelled)."""
    usages = [end.get("usage") or {"prompt_tokens": 0, "completion_tokens": 0} for end in ends]
    prompt = sum(max(u["prompt_tokens"] for u in usages[i:i + n]) for i in range(0, len(usages), n))
    completion = sum(u["completion_tokens"] for u in usages)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class _Offsets:
    """Where a choice's tokens start in its text, in characters: those the bytes of the tokens
    before make, decoded as the worker decodes them (a token may end inside a character)."""

    def __init__(self):
        self.chars, self._utf8 = 0, codecs.getincrementaldecoder("utf-8")(errors="replace")

    def take(self, raw: bytes) -> int:
        start = self.chars
        self.chars += len(self._utf8.decode(raw))
        return start


def _token(entry: dict) -> str:
    """A token as OpenAI's completions API spells it: its text, or "bytes:\\xNN..." where its bytes
    are not whole UTF-8 characters (as text, alternatives such as an emoji's first bytes would all
    be one U+FFFD key); a control token, which has no bytes, by its name."""
    raw = bytes(entry["bytes"])
    try:
        return raw.decode() if raw else entry["token"]
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def _completion_logprobs(entries: list[dict], offsets: _Offsets) -> dict:
    """Chat-style token entries as the completions API's parallel lists, text_offset from the
    choice's `offsets`. As OpenAI documents (and vLLM does), each top_logprobs object also holds
    the sampled token, up to logprobs + 1 entries."""
    return {"tokens": [_token(e) for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{_token(t): t["logprob"] for t in e["top_logprobs"]} | {_token(e): e["logprob"]}
                             for e in entries],
            "text_offset": [offsets.take(bytes(e["bytes"])) for e in entries]}


def _calls(gen: dict, end: dict) -> list[dict]:
    """The tool calls a choice answers: with parallel_tool_calls false, only the first."""
    calls = end.get("tool_calls") or []
    return calls[:1] if gen.get("parallel_tool_calls") is False else calls


def _finish(gen: dict, end: dict) -> str:
    return "tool_calls" if _calls(gen, end) else FINISH[end["finish_reason"]]


def response(head: dict, chat: bool, gen: dict, results: list[tuple[list[dict], dict]], n: int | None = None) -> dict:
    """The whole (not streamed) answer to a request: head is its id, created and model; results
    each choice's token records and end record, as its job's stream has them, n per prompt (all of
    them one prompt's when None). Batch output lines are this body too."""
    choices = []
    for index, (tokens, end) in enumerate(results):
        text = "".join(t["text"] for t in tokens)
        entries = [t["logprobs"] for t in tokens if "logprobs" in t]
        calls = _calls(gen, end)
        if chat:
            logprobs = {"content": entries} if "logprobs" in gen else None
            choice = {"message": {"role": "assistant", "content": text if text or not calls else None}
                      | ({"tool_calls": calls} if calls else {})}
        else:
            logprobs = _completion_logprobs(entries, _Offsets()) if "logprobs" in gen else None
            choice = {"text": text}
        choices.append({"index": index} | choice | {"logprobs": logprobs, "finish_reason": _finish(gen, end)})
    return head | {"object": "chat.completion" if chat else "text_completion", "choices": choices,
                   "usage": _usage([end for _, end in results], n or len(results))}


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


class _Abort(Exception):
    """A job's answer cannot be given: the response to send instead."""

    def __init__(self, response):
        super().__init__()
        self.response = response


def _collect(job_id: str) -> tuple[list[dict], dict]:
    """A job's token records and its end record, waiting for them."""
    tokens, end, next_check = [], None, time.monotonic() + CLIENT_CHECK_INTERVAL
    for record in queue.follow(job_id, block_ms=int(CLIENT_CHECK_INTERVAL * 1000)):
        if time.monotonic() >= next_check:
            next_check = time.monotonic() + CLIENT_CHECK_INTERVAL
            if _client_gone():   # nobody will read the answer: free the GPU
                raise _Abort(("", 499))   # nginx's "client closed request", for the access log
        if record is None:
            continue
        _, kind, data = record
        if kind == protocol.ERROR:
            raise _Abort(_failure(data))
        if kind == protocol.TOKEN:
            tokens.append(data)
        end = data
    return tokens, end


def _cancel(job_ids: list[str]) -> None:
    for job_id in job_ids:
        job = queue.fetch(job_id)
        if job is not None:
            queue.cancel(job)


def _respond(chat: bool):
    parsed = [parse(body, chat) for body in _prompts(requestbody.read(), chat)]
    body, gen, n = parsed[0]   # the prompts' bodies differ in their prompt only
    limits.admit(gen["model"], n * len(parsed))   # all or none: a refusal queues no choice, counts none
    metadata = body.get("metadata") or {}
    jobs = [queue.submit(sequence, priority="normal", metadata=metadata, kind="chat" if chat else "completion")[0]
            for _, one, _ in parsed for sequence in sequences(one, n)]
    head = {"id": ("chatcmpl-" if chat else "cmpl-") + jobs[0], "created": int(time.time()), "model": gen["model"]}
    if body.get("stream"):
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return _stream(jobs, head, chat, include_usage, gen, n)
    try:
        results = [_collect(job_id) for job_id in jobs]
    except _Abort as abort:
        _cancel(jobs)
        return abort.response
    return response(head, chat, gen, results, n)


def _stream(jobs: list[str], head: dict, chat: bool, include_usage: bool, gen: dict, n: int) -> Response:
    """The choices one after the other, each a job's stream as it comes (n per prompt)."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    logprobs = "logprobs" in gen

    def chunk(index: int, delta: dict, finish: str | None = None, entries: list | None = None,
              offsets: _Offsets | None = None) -> str:
        if chat:
            choice = {"delta": delta, "logprobs": {"content": entries} if entries else None}
        else:
            choice = {"text": delta.get("content") or "",
                      "logprobs": _completion_logprobs(entries, offsets) if entries else None}
        body = head | {"object": obj, "choices": [{"index": index} | choice | {"finish_reason": finish}]}
        return f"data: {json.dumps(body)}\n\n"

    def events():
        pending, ends = list(jobs), []
        try:
            for index, job_id in enumerate(jobs):
                yield chunk(index, {"role": "assistant", "content": ""})
                offsets = _Offsets()
                for record in queue.follow(job_id):
                    if record is None:
                        yield ": keep-alive\n\n"
                        continue
                    _, kind, data = record
                    if kind == protocol.TOKEN:
                        entries = [data["logprobs"]] if logprobs and "logprobs" in data else None
                        yield chunk(index, {"content": data["text"]}, entries=entries, offsets=offsets)
                    elif kind == protocol.ERROR:
                        yield f"data: {json.dumps(_failure(data)[0])}\n\n"
                        yield "data: [DONE]\n\n"
                        return
                    else:
                        if chat and _calls(gen, data):
                            yield chunk(index, {"tool_calls": [{"index": k} | call for k, call in
                                                               enumerate(_calls(gen, data))]})
                        yield chunk(index, {}, _finish(gen, data))
                        ends.append(data)
                pending.remove(job_id)
            if include_usage:
                yield f"data: {json.dumps(head | {'object': obj, 'choices': [], 'usage': _usage(ends, n)})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            _cancel(pending)   # the client went away, or a choice failed: free the GPU

    return Response(stream_with_context(events()), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@bp.post("/completions")
def completions():
    return _respond(chat=False)


@bp.post("/chat/completions")
def chat_completions():
    return _respond(chat=True)
