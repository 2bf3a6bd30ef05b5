"""The admin UI used as it should not be: odd query strings, forms with bad values, cancels of
jobs in every state, unknown ids. Each test here was a defect first (through the test client)."""
import html
import re

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from tests.conftest import API_KEY
from tests.test_ui import chromium, login

browser = pytest.fixture(scope="module")(chromium)


def client_login(client):
    token = re.search(r'name="csrf" value="([^"]+)"', client.get("/admin/login").get_data(as_text=True)).group(1)
    assert client.post("/admin/login", data={"api_key": API_KEY, "csrf": token}).status_code == 302


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


def test_the_submit_form_lets_any_temperature_the_api_takes_through(browser, live_url, worker):
    """The temperature field stepped by 0.05: Chromium refused to submit 0.123 ('The two nearest
    valid values are 0.1 and 0.15'), which the API takes; the job now runs with it."""
    login(browser, live_url)
    WebDriverWait(browser, 30).until(EC.presence_of_element_located((By.ID, "workers")))
    browser.get(f"{live_url}/admin/submit")
    browser.find_element(By.ID, "prompt").send_keys("The sky is")
    browser.find_element(By.ID, "max_tokens").clear()
    browser.find_element(By.ID, "max_tokens").send_keys("2")
    temperature = browser.find_element(By.NAME, "temperature")
    temperature.send_keys("0.123")
    assert browser.execute_script("return arguments[0].validationMessage", temperature) == ""
    browser.find_element(By.ID, "submit").click()
    WebDriverWait(browser, 30).until(EC.url_contains("/admin/jobs/"))
    params = {row.find_elements(By.TAG_NAME, "td")[0].text: row.find_elements(By.TAG_NAME, "td")[1].text
              for row in browser.find_elements(By.CSS_SELECTOR, "#params tbody tr")}
    assert (params["temperature"], params["max_tokens"]) == ("0.123", "2")


def test_cancelling_a_job_that_has_ended_says_so(client, worker):
    """A Cancel posted for a job that ended meanwhile (a page left open, a second click) came back
    to the job page with nothing said; it says the job had already ended, and the job keeps its state."""
    from tests.test_api import submit, wait
    client_login(client)
    job = submit(client, max_tokens=2)
    page = client.get(f"/admin/jobs/{job['id']}").get_data(as_text=True)     # opened while it runs
    token = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    assert wait(client, job["id"])["state"] == "finished"
    r = client.post(f"/admin/jobs/{job['id']}/cancel", data={"csrf": token}, follow_redirects=True)
    flashes = re.findall(r'<p class="flash">(.*?)</p>', html.unescape(r.get_data(as_text=True)))
    assert flashes == ["Nothing to cancel: the job had already ended (finished)."]
    assert wait(client, job["id"])["state"] == "finished"
