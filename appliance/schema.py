"""Request validation for the REST and OpenAI endpoints, from one table of parameters.

The web app never loads the engine, so it checks requests itself: parameter types and ranges
here, the model and its context against what the live workers registered, the prompt's length
in tokens as a worker counts it on request. The same table feeds the OpenAPI document, so the
document and the checks cannot drift apart."""
import json

from flask import current_app

from appliance import queue
from vkllm import sampling_defaults

# name -> (JSON type, minimum, maximum, whether the minimum itself is allowed): the sampling
# parameters a request may set, within what the worker's SamplingParams accepts.
SAMPLING = {
    "temperature": ("number", 0.0, 5.0, True),
    "top_k": ("integer", 0, 1000, True),
    "top_p": ("number", 0.0, 1.0, False),
    "min_p": ("number", 0.0, 1.0, True),
    "repeat_penalty": ("number", 0.0, 5.0, False),
    "repeat_last_n": ("integer", 0, 65536, True),
    "presence_penalty": ("number", -2.0, 2.0, True),
    "frequency_penalty": ("number", -2.0, 2.0, True),
    "seed": ("integer", -2**63, 2**64 - 1, True),   # OpenAI's int64, or the worker's uint64
    "min_tokens": ("integer", 0, 2**31 - 1, True),   # and at most max_tokens
}
MAX_STOP = 4
PRIORITIES = ("normal", "high")
ROLES = ("system", "developer", "user", "assistant", "tool")
TOOL_CHOICES = ("auto", "none", "required")   # or {"type": "function", "function": {"name": ...}}
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def worker_value(name: str, value):
    """A checked SAMPLING value as the worker takes it: a negative seed (OpenAI's int64) as the
    uint64 C's cast makes of it (-1: 2^64 - 1); the others as they are."""
    return value % 2**64 if name == "seed" else value


class Invalid(Exception):
    """A request the API refuses: status, message and the parameter at fault (OpenAI style)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code

    def body(self) -> dict:
        return {"error": {"message": self.message,
                          "type": "invalid_request_error" if self.status < 500 else "server_error",
                          "param": self.param, "code": self.code}}


def _number(body: dict, name: str, kind: str, lo, hi, lo_ok: bool = True):
    value = body[name]
    ok = isinstance(value, int) if kind == "integer" else isinstance(value, int | float)
    if not ok or isinstance(value, bool):
        raise Invalid(f"{name} must be an {kind}" if kind == "integer" else f"{name} must be a number", name)
    if not (lo <= value if lo_ok else lo < value) or value > hi:
        raise Invalid(f"{name} must be between {lo} and {hi}{'' if lo_ok else f' (above {lo})'}, got {value}",
                      name)
    return value


def _stop(value) -> list[str]:
    stop = [value] if isinstance(value, str) else value
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > MAX_STOP:
        raise Invalid(f"stop must be a non-empty string or a list of at most {MAX_STOP} of them", "stop")
    return stop


def _content(value, where: str) -> str:
    """A message's content: a string, or a list of text parts (joined by newlines, as vLLM does)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise Invalid(f"{where}.content must be a string or a non-empty list of text parts", "messages")
    texts = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise Invalid(f"{where}.content[{j}] is a {kind!r} part; only \"text\" parts are supported",
                          "messages", code="unsupported_content_part")
        if not isinstance(part.get("text"), str):
            raise Invalid(f"{where}.content[{j}].text must be a string", "messages")
        texts.append(part["text"])
    return "\n".join(texts)


def _tool_calls(value, where: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise Invalid(f"{where}.tool_calls must be a non-empty list", "messages")
    calls = []
    for j, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or not isinstance(function.get("arguments"), str):
            raise Invalid(f"{where}.tool_calls[{j}] must be {{id, type: \"function\", function: {{name, arguments}}}} "
                          f"with arguments a JSON string", "messages")
        try:
            json.loads(function["arguments"])
        except ValueError:
            raise Invalid(f"{where}.tool_calls[{j}].function.arguments is not JSON", "messages") from None
        calls.append({"id": str(call.get("id", "")), "type": "function",
                      "function": {"name": function["name"], "arguments": function["arguments"]}})
    return calls


def _messages(value) -> list[dict]:
    """Messages as OpenAI clients send them, made plain for the worker: content a string (or
    null beside tool calls), and only the fields chat templates read."""
    if not isinstance(value, list) or not value:
        raise Invalid("messages must be a non-empty list of {role, content} objects", "messages")
    messages = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise Invalid(f"{where} must have a role in {list(ROLES)}", "messages")
        message = {"role": m["role"]}
        if m["role"] == "assistant" and m.get("tool_calls"):
            message["tool_calls"] = _tool_calls(m["tool_calls"], where)
            message["content"] = None if m.get("content") in (None, "", []) else _content(m["content"], where)
        else:
            message["content"] = _content(m.get("content"), where)
        if m["role"] == "tool":
            if not isinstance(m.get("tool_call_id"), str):
                raise Invalid(f"{where} (a tool result) needs the tool_call_id it answers", "messages")
            message["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str):
            message["name"] = m["name"]
        messages.append(message)
    return messages


def _forced_function(choice) -> str | None:
    """The function a tool_choice object names; None for a string choice."""
    function = choice.get("function") if isinstance(choice, dict) else None
    named = isinstance(choice, dict) and choice.get("type") == "function" and isinstance(function, dict) \
        and isinstance(function.get("name"), str)
    if not named and choice is not None and choice not in TOOL_CHOICES:
        raise Invalid("tool_choice must be one of " + ", ".join(map(json.dumps, TOOL_CHOICES)) +
                      " or {\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
    return function["name"] if named else None


def _tools(body: dict) -> list[dict] | None:
    """The functions a chat offers the model, as its template describes them; None for none.
    tool_choice "auto" lets the model choose; "none" offers nothing; "required" or a named
    function offer them and force a call (constraint)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    _forced_function(choice)
    parallel_tool_calls(body)   # its type, even where no tool is offered
    if tools is None or choice == "none":
        return None
    if not isinstance(tools, list):
        raise Invalid("tools must be a list of {type: \"function\", function: {name, description, parameters}}",
                      "tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict) \
                or not isinstance(function.get("name"), str) or not function["name"] \
                or not isinstance(function.get("parameters", {}), dict) \
                or not isinstance(function.get("description", ""), str):
            raise Invalid(f"tools[{i}] must be {{type: \"function\", function: {{name, description, parameters}}}} "
                          f"with parameters a JSON schema object", "tools")
    return [{"type": "function", "function": t["function"]} for t in tools] or None


def parallel_tool_calls(body: dict) -> bool | None:
    """Whether an answer may hold several calls (in the Hermes format each <tool_call> block is
    one); None when unset. Unset, calls the model writes on its own are all kept (OpenAI's default),
    while a forced call is one call (llama.cpp server's default): a small model under a grammar
    that allows another call after each rarely stops."""
    value = body.get("parallel_tool_calls")
    if not isinstance(value, bool | None):
        raise Invalid("parallel_tool_calls must be true or false", "parallel_tool_calls")
    return value


def constraint(body: dict, tools: list[dict] | None) -> tuple[dict, str] | None:
    """What the output must be, for the worker's grammar (worker/engine/grammar.py), and the
    parameter that asked: a forced tool call (tool_choice "required" or a named function),
    else response_format's JSON object or JSON schema; None for free text. The schema's
    keywords are checked by the worker, which has the grammar library (see prompt_tokens)."""
    choice = body.get("tool_choice")
    name = _forced_function(choice)
    if choice == "required" or name is not None:
        if not tools and body.get("tools"):   # offered with a plain prompt, which has no template
            raise Invalid("tool_choice forces a call of one of the tools, which reach the model only through a "
                          "chat's template: they need messages, not a prompt", "prompt")
        if not tools:
            raise Invalid("tool_choice forces a tool call, which needs tools", "tool_choice")
        if name is not None and name not in [t["function"]["name"] for t in tools]:
            raise Invalid(f"tool_choice names the function {name!r}, which is not among the tools", "tool_choice")
        parallel = parallel_tool_calls(body) is True
        return {"type": "tool_call", "tools": tools, "name": name, "parallel": parallel}, "tool_choice"
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in RESPONSE_FORMATS:
        raise Invalid(f"response_format must be {{\"type\": one of {list(RESPONSE_FORMATS)}}}", "response_format")
    if kind == "json_object":
        return {"type": "json_object"}, "response_format"
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise Invalid("response_format json_schema must be {\"name\": ..., \"schema\": {a JSON schema object}}",
                          "response_format")
        if not isinstance(spec.get("strict", False), bool | None):
            raise Invalid("response_format json_schema.strict must be true or false (the schema is enforced "
                          "either way)", "response_format")
        return {"type": "json_schema", "schema": spec.get("schema", {})}, "response_format"
    return None


def _model(body) -> tuple[str, dict]:
    """The requested model, which a worker serves now or served before (its jobs then wait for
    one), and what that worker says of it."""
    if not isinstance(body, dict):
        raise Invalid("the body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise Invalid("model is required (see GET /v1/models)", "model")
    info = queue.model_info(model)
    if info is None:
        raise Invalid(f"unknown model {model!r}; served now: {sorted(queue.models()) or 'none'}", "model", 404,
                      "model_not_found")
    return model, info


def _prompt(body: dict, chat: bool | None) -> dict:
    """{"prompt": text} or {"messages": [...]}; chat=None accepts either (not both), True/False
    demands one."""
    if chat is None and body.get("prompt") is not None and body.get("messages") is not None:
        raise Invalid("send either prompt or messages, not both", "prompt")
    if chat is not False and "messages" in body:
        tools = _tools(body)
        return {"messages": _messages(body["messages"])} | ({"tools": tools} if tools else {})
    if chat is not True and isinstance(body.get("prompt"), str) and body["prompt"]:
        return {"prompt": body["prompt"]}
    need = {None: "prompt (a non-empty string) or messages", True: "messages", False: "prompt (a string)"}
    raise Invalid(f"{need[chat]} is required", "messages" if chat else "prompt")


def prompt_tokens(model: str, prompt: dict, constrained: tuple[dict, str] | None = None) -> int | None:
    """The prompt's exact length in tokens, from a worker; None when none answered in time.
    The worker also compiles the constraint, if any, and refuses one its grammar library cannot
    enforce (naming, say, the schema keywords it does not implement)."""
    try:
        return queue.count_tokens(model, **prompt, **({"constraint": constrained[0]} if constrained else {}))
    except ValueError as e:   # the worker cannot make it a prompt (a chat its template refuses)
        in_constraint = len(e.args) > 1 and e.args[1] == "constraint"
        raise Invalid(e.args[0], constrained[1] if in_constraint else next(iter(prompt))) from None


def generation(body, *, chat: bool | None) -> dict:
    """Validate a generation body; chat=None accepts either prompt or messages (REST), True/False
    demands one (OpenAI endpoints). Returns the request the worker runs."""
    model, served = _model(body)
    n_ctx = served["n_ctx"]
    prompt = _prompt(body, chat)
    params = {name: worker_value(name, _number(body, name, *spec))
              for name, spec in SAMPLING.items() if body.get(name) is not None}
    # unset ones as the model's worker says (its GGUF's recommendations, else llama.cpp's), so the
    # job records what it runs with
    params = sampling_defaults.fill(params, served.get("sampling_defaults"))
    default_max = current_app.config["DEFAULT_MAX_TOKENS"]
    # OpenAI's chat names it max_completion_tokens (max_tokens deprecated there): that one wins,
    # and errors name the parameter the request sent
    limit = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(limit)   # 0 and false are refused, not taken for unset
    params["max_tokens"] = _number(body | {limit: min(default_max, n_ctx) if max_tokens is None else max_tokens},
                                   limit, "integer", 1, n_ctx)
    if params.get("min_tokens", 0) > params["max_tokens"]:
        raise Invalid(f"min_tokens ({params['min_tokens']}) must not be above {limit} ({params['max_tokens']})",
                      "min_tokens")
    if body.get("ignore_eos") is not None:
        if not isinstance(body["ignore_eos"], bool):
            raise Invalid("ignore_eos must be true or false", "ignore_eos")
        params["ignore_eos"] = body["ignore_eos"]
    if body.get("stop") is not None:
        params["stop"] = _stop(body["stop"])
    # First a bound without tokenizing: no token is longer than the model's longest (its worker
    # says how long), so a prompt of more bytes than n_ctx of those cannot fit.
    param = next(iter(prompt))
    size = len(prompt["prompt"].encode()) if "prompt" in prompt else len(json.dumps(
        [m.get("content") or "" for m in prompt["messages"]], ensure_ascii=False).encode())
    if size > n_ctx * served["max_token_bytes"]:
        raise Invalid(f"the prompt ({size} bytes) is longer than the context of {model} ({n_ctx} tokens)",
                      param, 400, "context_length_exceeded")
    # Then the exact count from a worker. As in llama.cpp's server (and the engine's own check),
    # the prompt must leave room for one generated token; generation stops at the context's end
    # with finish_reason "length", so max_tokens is not added (vLLM's rule would refuse most
    # prompts whenever the default max_tokens is the whole context).
    constrained = constraint(body, prompt.get("tools"))
    # no worker to count: it checks later
    tokens = prompt_tokens(model, prompt, constrained) if served["workers"] else None
    if tokens is not None and tokens >= n_ctx:
        raise Invalid(f"the prompt has {tokens} tokens; the context of {model} is {n_ctx} tokens and must also "
                      f"hold at least one generated token", param, 400, "context_length_exceeded")
    # parallel_tool_calls false: the response keeps the first call the model writes (a forced
    # call's grammar allows only one)
    single = "tools" in prompt and parallel_tool_calls(body) is False
    return {"model": model} | prompt | {"params": params} | ({"constraint": constrained[0]} if constrained else {}) \
        | ({"parallel_tool_calls": False} if single else {})


def tokenize(body) -> tuple[str, int, dict]:
    """A POST /api/v1/tokenize body: the model, its context and the prompt or messages to count."""
    model, served = _model(body)
    return model, served["n_ctx"], _prompt(body, None)


def job_options(body: dict) -> tuple[str, dict]:
    """REST-only fields: priority and free-form metadata (kept with the job, returned as is);
    null is their default, as for every other field."""
    priority = _or_default(body.get("priority"), "normal")
    if priority not in PRIORITIES:
        raise Invalid(f"priority must be one of {list(PRIORITIES)}", "priority")
    metadata = _or_default(body.get("metadata"), {})
    if not isinstance(metadata, dict):
        raise Invalid("metadata must be a JSON object", "metadata")
    size, most = len(json.dumps(metadata).encode()), current_app.config["MAX_METADATA_BYTES"]
    if size > most:
        raise Invalid(f"metadata is {size} bytes as JSON; at most {most} are kept with a job", "metadata", 413,
                      "metadata_too_large")
    return priority, metadata


def _or_default(value, default):
    return default if value is None else value


MAX_OFFSET = 10 ** 9   # a job listing's largest offset: past any job, far below Redis' 64-bit ranges


def page(args) -> tuple[str | None, int, int]:
    """Query arguments of job listings: state, offset, limit."""
    state = args.get("state")
    if state is not None and state not in queue.STATES.values():
        raise Invalid(f"state must be one of {sorted(set(queue.STATES.values()))}", "state")
    offset, limit = _page_number(args, "offset", 0), _page_number(args, "limit", 20)
    if offset < 0:
        raise Invalid(f"offset must be at least 0, got {offset}", "offset")
    if offset > MAX_OFFSET:   # Redis refuses ranges past 64-bit integers
        raise Invalid(f"offset must be at most {MAX_OFFSET}, got {offset}", "offset")
    if not 1 <= limit <= 100:
        raise Invalid(f"limit must be between 1 and 100, got {limit}", "limit")
    return state, offset, limit


def _page_number(args, name: str, default: int) -> int:
    raw = args.get(name)
    try:
        return default if raw is None else int(raw)
    except ValueError:
        raise Invalid(f"{name} must be an integer, got {raw[:40]!r}", name) from None
