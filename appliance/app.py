"""The web app factory (flaskr style): defaults, then VKLLM_* from the environment, then one
blueprint per concern. Served by gunicorn in production: `gunicorn 'appliance.app:create_app()'`."""
import sys

from flask import Flask, current_app, jsonify, redirect, request, url_for
from redis.exceptions import OutOfMemoryError
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from appliance import (
    admin,
    api,
    auth,
    batches,
    files,
    limits,
    metrics,
    openai_api,
    queue,
)
from appliance.schema import Invalid
from vkllm import outage
from vkllm.config import WebServer

# Every page's scripts and styles come from /static: no inline script or handler may run, and no
# other site may frame the UI (clickjacking) or learn its URLs from the Referer.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def create_app(test_config: dict | None = None) -> Flask:
    app = Flask(__name__)
    app.config.from_mapping(
        REDIS_URL="redis://localhost:6379/0",
        API_KEY=None,                      # VKLLM_API_KEY; otherwise a generated key kept hashed in Redis
        SECRET_KEY=None,                   # VKLLM_SECRET_KEY; otherwise shared through Redis
        MODELS_DIR="models",
        DATA_DIR="data",                   # the Batch API's files go to DATA_DIR/files
        MAX_FILE_BYTES=100 * 1024 * 1024,  # an uploaded batch input file
        MAX_BATCH_LINES=50_000,            # requests in one batch (OpenAI's bound)
        BATCH_SWEEP_INTERVAL=5,            # seconds between a web process's looks at open batches; 0: none
        MAX_CONTENT_LENGTH=1024 * 1024,    # bodies above this get 413
        RESULT_TTL=7 * 86400,              # how long finished jobs and their streams stay readable
        JOB_TIMEOUT=24 * 3600,
        DEFAULT_MAX_TOKENS=256,
        MAX_METADATA_BYTES=16 * 1024,      # a job's metadata, as JSON
        MAX_QUEUED=1000,                   # jobs waiting per model; more get 429
        JOBS_PER_MINUTE=600,               # submissions per API key per minute; more get 429
        REDIS_OUTAGE_WAIT=30,              # seconds a followed stream waits for Redis before an error event
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=False,       # the cookie is Secure anyway when a page comes over https
        PERMANENT_SESSION_LIFETIME=8 * 3600,   # seconds an admin UI login lasts
        LOGIN_ATTEMPTS=10,                 # failed logins per client address within LOGIN_WINDOW
        LOGIN_WINDOW=15 * 60,
        # prometheus_client switches to files in this folder by itself; /metrics must merge them
        METRICS_MULTIPROCESS=WebServer.from_env().metrics_dir is not None,
    )
    if test_config is None:
        app.config.from_prefixed_env("VKLLM")
    else:
        app.config.from_mapping(test_config)

    queue.init_app(app)
    redis = app.extensions["vkllm_redis"]
    generated = auth.ensure_key(redis, app.config["API_KEY"])
    if generated:
        print(f"vkllm: no API key was configured; generated one (shown only now): {generated}",
              file=sys.stderr, flush=True)
    if not app.config["SECRET_KEY"]:
        app.config["SECRET_KEY"] = auth.secret_key(redis)

    app.session_interface = auth.SessionInterface()
    app.after_request(_security_headers)
    metrics.init_app(app)
    for module in (api, openai_api, files, batches, admin, metrics):
        app.register_blueprint(module.bp)
    batches.init_app(app)
    app.add_url_rule("/", "index", lambda: redirect(url_for("admin.dashboard")))
    app.register_error_handler(Invalid, lambda e: (jsonify(e.body()), e.status))
    app.register_error_handler(limits.Limited, lambda e: (jsonify(e.body()), e.status,
                                                          {"Retry-After": str(e.retry_after)}))
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(OutOfMemoryError, _redis_full)
    for unreachable in queue.UNAVAILABLE:
        app.register_error_handler(unreachable, _unavailable)
    return app


def _security_headers(response):
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def _redis_full(e: OutOfMemoryError):
    """Redis at its maxmemory refuses writes (it never evicts queued jobs): 503 until jobs expire."""
    body = Invalid("the job store (Redis) is full; try again once finished jobs have expired", None, 503,
                   "store_full").body()
    return jsonify(body), 503


def _unavailable(e: Exception):
    """Redis is down, unreachable or refusing writes: 503 in JSON for every route (the API,
    /metrics, the UI)."""
    current_app.logger.warning("Redis %s: %s", outage.describe(e), e)
    body = Invalid(f"the job queue (Redis) is unavailable ({outage.describe(e)}); try again shortly", status=503,
                   code="redis_unavailable").body()
    return jsonify(body), 503, {"Retry-After": "5"}


def _http_error(e: HTTPException):
    """JSON errors for API clients (413 body too large, 404, 405); the UI keeps HTML pages."""
    if request.path.startswith(("/api/", "/v1/")):
        if isinstance(e, RequestEntityTooLarge):   # stated too long, or found so while read (chunked)
            refusal = Invalid(f"the request body is over {request.max_content_length} bytes, the most a request "
                              f"may have", status=413, code="body_too_large")
        else:
            refusal = Invalid(e.description or e.name, status=e.code)
        return jsonify(refusal.body()), e.code
    return e
