"""The API key and the admin UI's session and CSRF tokens.

One key guards everything. VKLLM_API_KEY wins when set; otherwise a random key is generated on
first run and only its SHA-256 is kept in Redis (a random 256-bit key needs no slow hash), so the
key is shown once and can be rotated from the CLI. The UI logs in with the key and then holds a
session kept in Redis (the signed cookie carries only its id and the CSRF token): logging out
deletes it, it expires after PERMANENT_SESSION_LIFETIME, and it is bound to the key it was opened
with, so rotating the key ends every session. Failed logins are counted per client address and
throttled. The forms carry a CSRF token, and the session opens only read-only API calls (the live
stream), so a cross-site page cannot submit or cancel through a logged-in browser."""
import functools
import hashlib
import hmac
import secrets

from flask import abort, current_app, jsonify, redirect, request, session, url_for
from flask.sessions import SecureCookieSessionInterface

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


def key_generation() -> str:
    """The SHA-256 of the key in force ("" before there is one); it changes when the key does."""
    configured = current_app.config["API_KEY"]
    return digest(configured) if configured else (get_redis().get(protocol.API_KEY_HASH) or b"").decode()


def key_ok(presented: str | None) -> bool:
    if not presented:
        return False
    expected = key_generation()
    return bool(expected) and hmac.compare_digest(digest(presented), expected)


def presented_keys() -> list[str]:
    """The bearer token (the scheme's name in any case, RFC 7235) and the X-API-Key header, either
    of which may carry the key."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    keys = [token.strip()] if scheme.lower() == "bearer" else []
    return keys + [request.headers.get("X-API-Key", "")]


def require_key():
    """before_request hook of the API blueprints: a valid key, or a UI session for reads."""
    if any(key_ok(key) for key in presented_keys()):
        return None
    if request.method in ("GET", "HEAD") and logged_in():
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


def open_session() -> None:
    """After a good login: a new session id in the cookie, its record (the key's generation) in
    Redis for the session's lifetime."""
    session.clear()
    session.permanent = True
    session["sid"] = secrets.token_urlsafe(32)
    ttl = int(current_app.permanent_session_lifetime.total_seconds())
    get_redis().set(protocol.session_key(session["sid"]), key_generation(), ex=ttl)


def close_session() -> None:
    if "sid" in session:
        get_redis().delete(protocol.session_key(session["sid"]))
    session.clear()


def logged_in() -> bool:
    """A session whose record is still in Redis and was opened with the key in force now."""
    sid = session.get("sid")
    if not sid:
        return False
    stored = get_redis().get(protocol.session_key(sid))
    return stored is not None and hmac.compare_digest(stored.decode(), key_generation())


def login_retry_after() -> int | None:
    """Seconds this client must wait before trying a key again, or None when it may try now."""
    r, key = get_redis(), protocol.login_failures_key(request.remote_addr or "")
    if int(r.get(key) or 0) < current_app.config["LOGIN_ATTEMPTS"]:
        return None
    return max(1, r.ttl(key))


def login_failed() -> None:
    """Failures count within LOGIN_WINDOW seconds of the first one."""
    r, key = get_redis(), protocol.login_failures_key(request.remote_addr or "")
    with r.pipeline() as pipe:
        pipe.incr(key)
        pipe.expire(key, current_app.config["LOGIN_WINDOW"], nx=True)
        pipe.execute()


class SessionInterface(SecureCookieSessionInterface):
    """The cookie gets the Secure flag when the page was served over https (or when
    SESSION_COOKIE_SECURE says so), so a browser never sends it back in clear."""

    def get_cookie_secure(self, app) -> bool:
        return bool(app.config["SESSION_COOKIE_SECURE"]) or request.is_secure


def login_required(view):
    @functools.wraps(view)
    def wrapped(*args, **kwargs):
        if not logged_in():
            # back to the page asked for, its query (a job list's filter and page) too
            return redirect(url_for("admin.login", next=request.full_path if request.query_string else request.path))
        return view(*args, **kwargs)
    return wrapped
