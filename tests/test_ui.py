"""The admin UI in headless Chromium (Debian's chromium + chromedriver through selenium), plus
its CSRF and login checks through the test client."""
import html
import re

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.conftest import API_KEY
from tests.test_api import AUTH, wait

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage")


@pytest.fixture(scope="module")
def worker(start_worker):
    return start_worker("ui-w1")


def chromium():
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})   # CSP violations are logged there
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    yield driver
    driver.quit()


browser = pytest.fixture(scope="module")(chromium)
fresh_browser = pytest.fixture(chromium)   # one that has asked for nothing yet (Chromium remembers a missing icon)


def login(browser, live_url, key=API_KEY):
    browser.get(f"{live_url}/admin/login")
    browser.find_element(By.ID, "api_key").send_keys(key)
    browser.find_element(By.ID, "login").click()


def test_submit_in_the_browser_and_watch_the_text_stream(browser, live_url, worker, client):
    login(browser, live_url, "wrong-key")
    flash = WebDriverWait(browser, 30).until(EC.presence_of_element_located((By.CLASS_NAME, "flash")))
    assert "not valid" in flash.text
    login(browser, live_url)
    WebDriverWait(browser, 30).until(EC.presence_of_element_located((By.ID, "workers")))
    assert "ui-w1" in browser.find_element(By.ID, "workers").text

    browser.get(f"{live_url}/admin/submit")
    browser.find_element(By.ID, "prompt").send_keys("The sky is")
    max_tokens = browser.find_element(By.ID, "max_tokens")
    max_tokens.clear()
    max_tokens.send_keys("6")
    browser.find_element(By.ID, "submit").click()

    WebDriverWait(browser, 300).until(EC.text_to_be_present_in_element((By.ID, "state"), "finished"))
    job_id = re.search(r"/admin/jobs/([0-9a-f-]+)", browser.current_url).group(1)
    shown = browser.find_element(By.ID, "output").get_attribute("textContent")
    job = wait(client, job_id)
    assert job["metadata"] == {"source": "admin"} and job["progress"]["max_tokens"] == 6
    assert shown == job["output"] and shown

    browser.get(f"{live_url}/admin/jobs")
    row = browser.find_element(By.ID, "jobs").text
    assert job_id[:8] in row and "finished" in row

    browser.get(f"{live_url}/admin/models")
    models = browser.find_element(By.ID, "models").text
    assert "tiny-llama.gguf llama Q4_K_M" in models and "yes, ctx 256 on ui-w1" in models
    assert "yes, ctx 256 on ui-w1 temperature 0.8, top_k 40, top_p 0.95, min_p 0.05," in models
    # every page ran under the Content-Security-Policy without it blocking anything
    assert not [e["message"] for e in browser.get_log("browser") if "Content Security Policy" in e["message"]]


def test_forms_need_the_csrf_token_and_pages_need_a_login(client):
    assert client.get("/admin/").status_code == 302
    page = client.get("/admin/login").get_data(as_text=True)
    token = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    assert client.post("/admin/login", data={"api_key": API_KEY}).status_code == 400   # no token
    r = client.post("/admin/login", data={"api_key": API_KEY, "csrf": token})
    assert r.status_code == 302
    assert client.post("/admin/jobs/x/cancel", data={}).status_code == 400
    # the session opens the API for reads only: no submitting through a logged-in browser
    assert client.get("/api/v1/models").status_code == 200
    assert client.post("/api/v1/jobs", json={"model": "tiny-llama", "prompt": "x"}).status_code == 401
    assert client.post("/api/v1/jobs", json={}, headers=AUTH).status_code == 400


def test_job_page_shows_the_request_parameters_timings_and_usage(browser, live_url, worker, client):
    """A REST job that sets no sampling parameter: the page shows its prompt as text (markup
    escaped, a long one folded), the defaults it ran with, its timings and usage, and no error."""
    prompt = "<b>not bold</b> & " + "the " * 150
    r = client.post("/api/v1/jobs", json={"model": "tiny-llama", "prompt": prompt, "max_tokens": 4, "seed": 1},
                    headers=AUTH)
    assert r.status_code == 202, r.json
    job = wait(client, r.json["id"])
    login(browser, live_url)
    WebDriverWait(browser, 30).until(EC.presence_of_element_located((By.ID, "workers")))
    browser.get(f"{live_url}/admin/jobs/{job['id']}")
    WebDriverWait(browser, 60).until(EC.text_to_be_present_in_element((By.ID, "state"), "finished"))
    shown = browser.find_element(By.ID, "prompt")
    assert shown.get_attribute("open") is None   # long: folded until clicked
    assert f"Prompt ({len(prompt)} characters)" in shown.text
    shown.find_element(By.TAG_NAME, "summary").click()
    assert shown.find_element(By.TAG_NAME, "pre").get_attribute("textContent") == prompt
    assert browser.find_elements(By.TAG_NAME, "b") == []   # the markup stayed text
    rows = [row.text for row in browser.find_elements(By.CSS_SELECTOR, "#params tbody tr")]
    assert sorted(rows) == sorted(f"{name} {value}" for name, value in job["params"].items())
    assert {"temperature 0.8", "top_k 40", "top_p 0.95", "min_p 0.05", "seed 1", "max_tokens 4"} <= set(rows)
    assert browser.find_element(By.ID, "model").text == "tiny-llama"
    assert browser.find_element(By.ID, "usage").text == (
        f"{job['usage']['prompt_tokens']} prompt tokens, 4 completion tokens")
    t = job["timings"]
    assert browser.find_element(By.ID, "timings").text == (
        f"time to first token {t['time_to_first_token']:.3f} s, prompt {t['prompt_tokens_per_second']:.1f} "
        f"tokens/s, generation {t['generation_tokens_per_second']:.1f} tokens/s")
    assert not browser.find_element(By.ID, "error-row").is_displayed()

    # a chat, short: its messages shown open, by role
    r = client.post("/api/v1/jobs", json={"model": "tiny-llama", "max_tokens": 2, "temperature": 0, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <there>"}]}, headers=AUTH)
    wait(client, r.json["id"])
    browser.get(f"{live_url}/admin/jobs/{r.json['id']}")
    second = browser.find_element(By.ID, "message-1")
    assert second.get_attribute("open") is not None
    assert second.text == "user (10 characters)\nHi <there>"
    assert "temperature 0" in [row.text for row in browser.find_elements(By.CSS_SELECTOR, "#params tbody tr")]


def client_login(client):
    page = client.get("/admin/login").get_data(as_text=True)
    token = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    assert client.post("/admin/login", data={"api_key": API_KEY, "csrf": token}).status_code == 302
    return token


def test_a_bad_query_argument_gets_an_html_error_page(client):
    """The UI's errors are HTML pages, like its 400 for a stale form token (this one was the API's JSON)."""
    client_login(client)
    for query, message in (("state=bogus", "state must be one of ['cancelled', 'failed', 'finished', 'queued', 'running']"),
                           ("limit=0", "limit must be between 1 and 100, got 0")):
        r = client.get(f"/admin/jobs?{query}")
        assert (r.status_code, r.mimetype) == (400, "text/html")
        assert f"<p>{message}</p>" in html.unescape(r.get_data(as_text=True))


def test_a_refused_submission_keeps_what_was_chosen(browser, live_url, worker):
    """The server refuses max_tokens past the context (256); the form comes back with every field
    as the user set it (the priority went back to normal)."""
    login(browser, live_url)
    WebDriverWait(browser, 30).until(EC.presence_of_element_located((By.ID, "workers")))
    browser.get(f"{live_url}/admin/submit")
    browser.find_element(By.ID, "prompt").send_keys("The sky is")
    browser.find_element(By.NAME, "chat").click()
    browser.find_element(By.ID, "max_tokens").clear()
    browser.find_element(By.ID, "max_tokens").send_keys("1000")
    browser.find_element(By.NAME, "temperature").send_keys("0.5")
    Select(browser.find_element(By.NAME, "priority")).select_by_visible_text("high")
    browser.find_element(By.ID, "submit").click()
    flash = WebDriverWait(browser, 30).until(EC.presence_of_element_located((By.CLASS_NAME, "flash")))
    assert "max_tokens" in flash.text
    assert Select(browser.find_element(By.NAME, "priority")).first_selected_option.text == "high"
    assert Select(browser.find_element(By.NAME, "model")).first_selected_option.get_attribute("value") == "tiny-llama"
    assert browser.find_element(By.ID, "prompt").get_attribute("value") == "The sky is"
    assert browser.find_element(By.NAME, "chat").is_selected()
    assert browser.find_element(By.ID, "max_tokens").get_attribute("value") == "1000"
    assert browser.find_element(By.NAME, "temperature").get_attribute("value") == "0.5"


def test_a_form_with_max_tokens_0_is_refused_as_the_api_refuses_it(client, worker):
    """Posted directly (the browser's min=1 aside), 0 was taken for unset and the job queued with the
    default; it is refused with the API's message, and the form keeps the user's fields."""
    client_login(client)
    token = re.search(r'name="csrf" value="([^"]+)"', client.get("/admin/submit").get_data(as_text=True)).group(1)
    total = client.get("/api/v1/jobs", headers=AUTH).json["total"]
    r = client.post("/admin/submit", data={"csrf": token, "model": "tiny-llama", "prompt": "The sky is",
                                           "max_tokens": "0", "temperature": "0.5", "priority": "high"})
    page = html.unescape(r.get_data(as_text=True))
    assert (r.status_code, r.mimetype) == (200, "text/html")
    assert '<p class="flash">max_tokens must be between 1 and 256, got 0</p>' in page
    assert 'value="0"' in page and 'value="0.5"' in page and ">The sky is</textarea>" in page
    assert "<option selected>high</option>" in page
    assert client.get("/api/v1/jobs", headers=AUTH).json["total"] == total
    r = client.post("/api/v1/jobs", json={"model": "tiny-llama", "prompt": "The sky is", "max_tokens": 0},
                    headers=AUTH)
    assert (r.status_code, r.json["error"]["message"]) == (400, "max_tokens must be between 1 and 256, got 0")


def test_pages_ask_for_nothing_that_is_not_there(fresh_browser, live_url):
    """No page's load fails a request, the icon Chromium asks for included (each page got a
    /favicon.ico 404), nor breaks the Content-Security-Policy."""
    login(fresh_browser, live_url)
    WebDriverWait(fresh_browser, 30).until(EC.presence_of_element_located((By.ID, "workers")))
    for page in ("jobs", "submit", "models", "batches"):
        fresh_browser.get(f"{live_url}/admin/{page}")
    assert [e["message"] for e in fresh_browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")] == []
