"""The admin session and the API key: logout and `vkllm apikey rotate` end sessions (a replayed
cookie opens nothing), sessions last hours, the cookie is Secure over https, failed logins are
throttled per address, the UI's pages carry security headers and no inline script, and either
auth header may carry the key."""
import re
import subprocess
import sys
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

import pytest
from redis import Redis

from appliance.app import create_app
from tests.conftest import API_KEY, VKLLM


def login(client, key=API_KEY, **kw):
    page = client.get("/admin/login", **kw).get_data(as_text=True)
    token = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    return client.post("/admin/login", data={"api_key": key, "csrf": token}, **kw)


def csrf_of(client) -> str:
    page = client.get("/admin/").get_data(as_text=True)
    return re.search(r'name="csrf" value="([^"]+)"', page).group(1)


def opens_the_ui(client) -> bool:
    return client.get("/admin/").status_code == 200 and client.get("/api/v1/models").status_code == 200


def test_logout_ends_the_session_even_for_a_kept_cookie(app):
    client = app.test_client()
    assert login(client).status_code == 302
    assert opens_the_ui(client)
    kept = client.get_cookie("session").value
    assert client.post("/admin/logout", data={"csrf": csrf_of(client)}).status_code == 302
    client.set_cookie("session", kept)   # what a stolen or copied cookie would do
    assert client.get("/admin/").status_code == 302
    assert client.get("/api/v1/models").status_code == 401


@pytest.fixture
def generated_key_app(redis_url):
    """An app with no configured key (the key lives hashed in Redis), on a Redis database of its own."""
    url = redis_url.rsplit("/", 1)[0] + "/4"
    Redis.from_url(url).flushdb()
    return create_app({"REDIS_URL": url, "SECRET_KEY": "test-secret", "TESTING": True}), url


def test_rotating_the_key_ends_every_session(generated_key_app):
    app, url = generated_key_app
    rotated = subprocess.run([sys.executable, "-c", VKLLM, "apikey", "rotate", "--redis-url", url],
                             capture_output=True, text=True, check=True)
    key = re.search(r"new API key \(shown only now\): (\S+)", rotated.stdout).group(1)
    client = app.test_client()
    assert login(client, key).status_code == 302 and opens_the_ui(client)
    subprocess.run([sys.executable, "-c", VKLLM, "apikey", "rotate", "--redis-url", url], check=True,
                   capture_output=True)
    assert client.get("/admin/").status_code == 302
    assert client.get("/api/v1/models").status_code == 401


def test_a_session_lasts_hours_and_is_secure_over_https(app):
    client = app.test_client()
    r = login(client)
    cookie = r.headers["Set-Cookie"]
    expires = parsedate_to_datetime(re.search(r"Expires=([^;]+)", cookie).group(1))
    hours = (expires - datetime.now(timezone.utc)).total_seconds() / 3600
    assert 1 <= hours <= 12, cookie
    assert "Secure" not in cookie and "HttpOnly" in cookie
    secure = app.test_client()
    r = login(secure, base_url="https://localhost")
    assert r.status_code == 302 and "; Secure" in r.headers["Set-Cookie"]


def test_failed_logins_are_throttled_per_address(redis_url):
    app = create_app({"REDIS_URL": redis_url, "API_KEY": API_KEY, "SECRET_KEY": "test-secret", "TESTING": True,
                      "LOGIN_ATTEMPTS": 3})
    attacker, address = app.test_client(), {"REMOTE_ADDR": "192.0.2.7"}
    Redis.from_url(redis_url).delete("vkllm:login-failures:192.0.2.7")
    for _ in range(3):
        r = login(attacker, "wrong", environ_base=address)
        assert r.status_code == 200 and "not valid" in r.get_data(as_text=True)
    r = login(attacker, environ_base=address)   # even the right key, once over the limit
    assert r.status_code == 429 and 1 <= int(r.headers["Retry-After"]) <= 15 * 60
    assert attacker.get("/admin/", environ_base=address).status_code == 302
    other = app.test_client()
    assert login(other, environ_base={"REMOTE_ADDR": "192.0.2.8"}).status_code == 302


PAGES = ["/admin/login", "/admin/", "/admin/jobs", "/admin/submit", "/admin/models"]


@pytest.mark.parametrize("path", PAGES)
def test_pages_have_security_headers_and_no_inline_script(app, path):
    client = app.test_client()
    login(client)
    r = client.get(path)
    assert r.status_code == 200
    csp = r.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert r.headers["X-Frame-Options"] == "DENY" and r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.headers["Referrer-Policy"] == "same-origin"
    html = r.get_data(as_text=True)
    # what the policy would block: inline scripts, event-handler attributes, javascript: links, inline styles
    assert all("src=" in tag for tag in re.findall(r"<script[^>]*>", html))
    assert not re.search(r"\son[a-z]+\s*=|javascript:|\sstyle\s*=|<style", html, re.I)


def test_api_answers_carry_the_headers_too(client):
    r = client.get("/api/v1/models")
    assert r.status_code == 401
    assert r.headers["X-Content-Type-Options"] == "nosniff" and "frame-ancestors 'none'" in r.headers[
        "Content-Security-Policy"]


@pytest.mark.parametrize("headers", [
    {"Authorization": "Bearer wrong", "X-API-Key": API_KEY},
    {"Authorization": f"Bearer {API_KEY}", "X-API-Key": "wrong"},
    {"Authorization": "Basic Zm9vOmJhcg==", "X-API-Key": API_KEY},
])
def test_either_header_may_carry_the_key(client, headers):
    assert client.get("/api/v1/models", headers=headers).status_code == 200


def test_logging_in_returns_to_the_page_asked_for_with_its_query(app):
    """A page asked for without a session sends to the login, which then returns to it: its query
    string was dropped (a filtered, paginated job list came back unfiltered, from the start)."""
    client = app.test_client()
    asked = "/admin/jobs?state=failed&offset=20"
    to_login = client.get(asked)
    assert to_login.status_code == 302
    login_url = to_login.headers["Location"]
    token = re.search(r'name="csrf" value="([^"]+)"', client.get(login_url).get_data(as_text=True)).group(1)
    done = client.post(login_url, data={"api_key": API_KEY, "csrf": token})
    assert done.status_code == 302 and done.headers["Location"] == asked
    assert client.get("/admin/jobs").headers.get("Location") is None   # logged in
    fresh = app.test_client()
    assert fresh.get("/admin/models").headers["Location"] == "/admin/login?next=/admin/models"
