"""The OpenAPI 3.1 document of the REST API, built from the same parameter table the checks use."""
from appliance import schema
from vkllm import sampling_defaults

ERROR = {"$ref": "#/components/schemas/Error"}
PARAMS = {"type": ["object", "null"],
          "description": "the sampling parameters the job runs with, the defaults it took included"}


def _response(description: str, schema_ref: dict | None = None, media: str = "application/json") -> dict:
    out = {"description": description}
    if schema_ref is not None:
        out["content"] = {media: {"schema": schema_ref}}
    return out


def _errors(*codes: int) -> dict:
    text = {400: "Invalid request", 401: "Missing or wrong API key", 404: "Unknown job or model",
            413: "Body too large", 503: "No worker serving the model answered in time"}
    return {str(c): _response(text[c], ERROR) for c in codes}


def _prompt_request(props: dict) -> dict:
    """A request naming a model and either a prompt or chat messages, with `props` besides."""
    return {"type": "object", "required": ["model"], "properties": {
        "model": {"type": "string", "description": "a name from GET /api/v1/models"},
        "prompt": {"type": "string", "minLength": 1},
        "messages": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role"],
            "properties": {"role": {"enum": list(schema.ROLES)},
                           "content": {"oneOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": {
                               "type": "object", "required": ["type", "text"],
                               "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}}],
                                       "description": "null only beside tool_calls (assistant)"},
                           "tool_calls": {"type": "array", "items": {"type": "object"}},
                           "tool_call_id": {"type": "string", "description": "which call a tool message answers"}}}},
        "tools": {"type": "array", "items": {"type": "object"},
                  "description": "OpenAI function definitions, given to the model's chat template"},
        "tool_choice": {"oneOf": [{"enum": list(schema.TOOL_CHOICES)}, {"type": "object"}],
                        "description": "\"required\" or {type: function, function: {name}} forces a call"},
        "parallel_tool_calls": {"type": "boolean", "description": (
            "whether an answer may hold several calls (in the Hermes format, one <tool_call> block each); "
            "false: at most one, the first the model writes. Unset: every call the model writes on its own "
            "is kept (OpenAI's default), and a forced call is one call (llama.cpp server's default); true "
            "lets a forced answer hold several")},
        "response_format": {"type": "object", "required": ["type"], "properties": {
            "type": {"enum": list(schema.RESPONSE_FORMATS)},
            "json_schema": {"type": "object", "properties": {
                "name": {"type": "string"}, "schema": {"type": "object"},
                "strict": {"type": "boolean", "description": "accepted; the schema is enforced whatever its value "
                                                             "(every token is one its grammar allows)"}}}},
            "description": "constrains the output to a JSON object or to JSON valid under a schema"},
    } | props, "oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}]}


def _job_request() -> dict:
    props = {name: {"type": kind, "minimum" if lo_ok else "exclusiveMinimum": lo, "maximum": hi}
             | ({"description": sampling_defaults.describe(name)} if name in sampling_defaults.SERVER else {})
             for name, (kind, lo, hi, lo_ok) in schema.SAMPLING.items()}
    props["seed"]["description"] = "unset: a different draw every run; a negative one (OpenAI's int64) is 2^64 plus it"
    props["temperature"]["description"] += "; 0 decodes greedily"
    props["min_tokens"]["description"] = ("no end-of-generation token is drawn, and no stop string ends the "
                                          "text, before this many tokens (at most max_tokens; vLLM's); unset: 0")
    props |= {
        "max_tokens": {"type": "integer", "minimum": 1, "description": "at most the model's context"},
        "ignore_eos": {"type": "boolean", "default": False, "description": (
            "an end-of-generation token does not end the generation, which goes on to max_tokens or a stop "
            "string (vLLM's and llama.cpp server's; for benchmarks)")},
        "stop": {"oneOf": [{"type": "string"}, {"type": "array", "maxItems": schema.MAX_STOP,
                                                  "items": {"type": "string"}}]},
        "priority": {"enum": [*schema.PRIORITIES, None], "default": "normal"},
        "metadata": {"type": ["object", "null"], "description": "kept with the job and returned as is"},
    }
    return _prompt_request(props)


def _job() -> dict:
    number, string = {"type": ["number", "null"]}, {"type": ["string", "null"]}
    return {"type": "object", "properties": {
        "id": {"type": "string"}, "object": {"const": "job"},
        "state": {"enum": ["queued", "running", "finished", "failed", "cancelled"]},
        "model": string, "kind": string, "priority": string, "metadata": {"type": ["object", "null"]},
        "progress": {"type": ["object", "null"], "properties": {"tokens": {"type": "integer"},
                                                               "max_tokens": {"type": "integer"}}},
        "queue_position": {"type": ["integer", "null"]}, "created_at": number, "started_at": number,
        "ended_at": number, "output": {"type": ["string", "null"], "description": "null in listings (read the job)"},
        "finish_reason": string,
        "usage": {"type": ["object", "null"]}, "timings": {"type": ["object", "null"]}, "error": string,
        "params": PARAMS}}


def document() -> dict:
    job_id = [{"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    job = {"$ref": "#/components/schemas/Job"}
    return {
        "openapi": "3.1.0",
        "info": {"title": "vkllm REST API", "version": "1"},
        "servers": [{"url": "/api/v1"}],
        "security": [{"bearer": []}],
        "paths": {
            "/jobs": {
                "post": {"summary": "Submit a generation job", "description": (
                    "Refused with 400 (code context_length_exceeded) when the prompt, as a worker "
                    "serving the model counts its tokens, does not leave one token of the model's "
                    "context free for generation; generation stops at the context's end."),
                    "requestBody": {"required": True, "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/JobRequest"}}}},
                    "responses": {"202": _response("Queued", {"type": "object", "properties": {
                        "id": {"type": "string"}, "queue_position": {"type": "integer"}, "params": PARAMS}}),
                        **_errors(400, 401, 404, 413)}},
                "get": {"summary": "List jobs, newest first (without their output)", "parameters": [
                    {"name": "state", "in": "query", "schema": _job()["properties"]["state"]},
                    {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0, "maximum": schema.MAX_OFFSET}},
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}}],
                    "responses": {"200": _response("A page of jobs", {"type": "object", "properties": {
                        "data": {"type": "array", "items": job}, "total": {"type": "integer"}}}),
                        **_errors(400, 401)}},
            },
            "/jobs/{job_id}": {"get": {"summary": "A job's state, progress and output so far",
                                       "parameters": job_id,
                                       "responses": {"200": _response("The job", job), **_errors(401, 404)}}},
            "/jobs/{job_id}/stream": {"get": {
                "summary": "Server-Sent Events: token, end and error events; resumable with Last-Event-ID",
                "parameters": job_id + [{"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}}],
                "responses": {"200": _response("Event stream", {"type": "string"}, "text/event-stream"),
                              "204": {"description": "Last-Event-ID is the stream's end or error event: "
                                                     "nothing is left (EventSource stops reconnecting)"},
                              **_errors(401, 404)}}},
            "/jobs/{job_id}/cancel": {"post": {"summary": "Cancel a queued or running job", "parameters": job_id,
                                               "responses": {"200": _response("Cancelled or already ended", job),
                                                             "202": _response("Running; stops within a few tokens",
                                                                              job),
                                                             **_errors(401, 404)}}},
            "/tokenize": {"post": {
                "summary": "Count a prompt's (or chat's) tokens as the model's worker will",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/TokenizeRequest"}}}},
                "responses": {"200": _response("The count and the model's context", {
                    "type": "object", "properties": {"model": {"type": "string"}, "tokens": {"type": "integer"},
                                                     "n_ctx": {"type": "integer"}}}),
                    **_errors(400, 401, 404, 413, 503)}}},
            "/models": {"get": {"summary": "Models the live workers serve",
                                "description": "Each with its context (n_ctx) and sampling_defaults: what a "
                                               "request that leaves a sampling parameter unset gets",
                                "responses": {"200": _response("Models", {"type": "object"}), **_errors(401)}}},
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "JobRequest": _job_request(), "TokenizeRequest": _prompt_request({}), "Job": _job(),
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                    "type": "object", "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                                                     "param": {"type": ["string", "null"]},
                                                     "code": {"type": ["string", "null"]}}}}},
            },
        },
    }
