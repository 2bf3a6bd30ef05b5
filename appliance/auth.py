"""The API key and the admin UI's session and CSRF tokens.

One key guards everything. VKLLM_API_KEY wins when set; otherwise a random key is generated on
first run and only its SHA-256 is kept in Redis (a random 256-bit key needs no slow hash), so the
key is shown once and can be rotated from the CLI. The UI logs in with the key and then uses a
signed session; its forms carry a CSRF token, and the session opens only read-only API calls
(the live stream), so a cross-site page cannot submit or cancel through a logged-in browser."""
import functools
import hashlib
import hmac
import secrets

from flask import abort, current_app, jsonify, redirect, request, session, url_for

from appliance.queue import get_redis
from vkllm import protocol


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def ensure_key(redis, configured: str | None) -> str | None:
    """Create the key on first run; returns it (to print once) only when this call made it."""
    if configured:
        return None
    key = secrets.token_urlsafe(32)
    return key if redis.set(protocol.API_KEY_HASH, digest(key), nx=True) else None


def rotate(redis) -> str:
    key = secrets.token_urlsafe(32)
    redis.set(protocol.API_KEY_HASH, digest(key))
    return key


def secret_key(redis) -> str:
    """The session-signing key, shared by every web process through Redis."""
    redis.set(protocol.SECRET_KEY, secrets.token_hex(32), nx=True)
    return redis.get(protocol.SECRET_KEY).decode()


def key_ok(presented: str | None) -> bool:
    if not presented:
        return False
    configured = current_app.config["API_KEY"]
    expected = digest(configured) if configured else (get_redis().get(protocol.API_KEY_HASH) or b"").decode()
    return bool(expected) and hmac.compare_digest(digest(presented), expected)


def presented_key() -> str | None:
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        return header[7:].strip()
    return request.headers.get("X-API-Key")


def require_key():
    """before_request hook of the API blueprints: a valid key, or a UI session for reads."""
    if key_ok(presented_key()):
        return None
    if request.method in ("GET", "HEAD") and session.get("logged_in"):
        return None
    response = jsonify({"error": {"message": "a valid API key is required (Authorization: Bearer <key>)",
                                  "type": "authentication_error", "param": None, "code": "invalid_api_key"}})
    response.status_code = 401
    response.headers["WWW-Authenticate"] = "Bearer"
    return response


def csrf_token() -> str:
    if "csrf" not in session:
        session["csrf"] = secrets.token_urlsafe(24)
    return session["csrf"]


def check_csrf() -> None:
    if request.method != "POST":
        return
    expected = session.get("csrf")
    if not expected or not hmac.compare_digest(request.form.get("csrf", ""), expected):
        abort(400, "missing or stale form token; reload the page")


def login_required(view):
    @functools.wraps(view)
    def wrapped(*args, **kwargs):
        if not session.get("logged_in"):
            return redirect(url_for("admin.login", next=request.path))
        return view(*args, **kwargs)
    return wrapped
