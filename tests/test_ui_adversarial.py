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
