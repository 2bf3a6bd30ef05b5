"""The admin UI used as it should not be: odd query strings, forms with bad values, cancels of
jobs in every state, unknown ids. Each test here was a defect first (through the test client)."""
import html
import re

import pytest

from tests.conftest import API_KEY


def client_login(client):
    token = re.search(r'name="csrf" value="([^"]+)"', client.get("/admin/login").get_data(as_text=True)).group(1)
    assert client.post("/admin/login", data={"api_key": API_KEY, "csrf": token}).status_code == 302
    return token


@pytest.mark.parametrize("query,message", [
    ("offset=99999999999999999999999999", "offset must be at most 1000000000, got 99999999999999999999999999"),
    ("state=finished&offset=9223372036854775807", "offset must be at most 1000000000, got 9223372036854775807"),
])
def test_a_job_list_offset_past_any_job_is_refused_not_a_server_error(client, query, message):
    """An offset past Redis' 64-bit integers was a 500 (ZREVRANGE's 'value is not an integer')."""
    client_login(client)
    r = client.get(f"/admin/jobs?{query}")
    assert (r.status_code, r.mimetype) == (400, "text/html")
    assert f"<p>{message}</p>" in html.unescape(r.get_data(as_text=True))
    assert client.get("/admin/jobs?offset=1000000000").status_code == 200     # the bound itself: an empty page


@pytest.fixture(scope="module")
def worker(start_worker):
    return start_worker("adv-w1")


def _submit(client, **fields) -> tuple[int, list[str]]:
    token = re.search(r'name="csrf" value="([^"]+)"', client.get("/admin/submit").get_data(as_text=True)).group(1)
    form = {"csrf": token, "model": "tiny-llama", "prompt": "The sky is", "priority": "normal"} | fields
    r = client.post("/admin/submit", data=form)
    return r.status_code, re.findall(r'<p class="flash">(.*?)</p>', html.unescape(r.get_data(as_text=True)))


def test_the_submit_form_reads_numbers_as_the_browser_sends_them_and_names_the_bad_one(client, worker):
    """Chromium's number input takes '1e3' as 1000 and sends it as typed: it was refused with
    'max_tokens and temperature must be numbers.', which named neither the field nor the value."""
    client_login(client)
    assert _submit(client, max_tokens="1e3") == (200, ["max_tokens must be between 1 and 256, got 1000"])
    assert _submit(client, max_tokens="2.5") == (200, ["max_tokens must be a whole number, got '2.5'"])
    assert _submit(client, max_tokens="many") == (200, ["max_tokens must be a number, got 'many'"])
    assert _submit(client, max_tokens="4", temperature="warm") == (200, ["temperature must be a number, got 'warm'"])
    assert _submit(client, max_tokens="4", temperature="1e1") == (200, ["temperature must be between 0.0 and 5.0, got 10.0"])
