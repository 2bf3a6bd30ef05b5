"""The admin UI's job page through a Redis outage, in headless Chromium: a private redis-server
stopped and started again by pid, a real worker paused and resumed by pid."""
import os
import signal
import time

from redis import Redis
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from tests.test_resilience import redis_server, served, submit, wait_for, workers  # noqa: F401 (fixtures)
from tests.test_ui import browser, login  # noqa: F401 (fixture)
from vkllm import protocol


def shown(browser, element_id) -> str:
    return browser.find_element(By.ID, element_id).get_attribute("textContent")


def test_the_job_page_resumes_its_stream_after_a_redis_outage(browser, redis_server, served, workers):
    """The stream's error event of kind "unavailable" (Redis away longer than the web app waits)
    said nothing of the job, yet the page marked it failed and stopped following. It now says it
    is reconnecting, tries again (a 503 while Redis is away) and resumes after the last token it
    showed, so the page ends with the job's whole text, once, and its real end."""
    url, app = served
    app.config["REDIS_OUTAGE_WAIT"] = 1
    worker = workers("ui-outage")
    os.kill(worker.proc.pid, signal.SIGSTOP)   # the job waits in the queue until the page follows it
    try:
        job_id = submit(url, max_tokens=200)
        login(browser, url)
        WebDriverWait(browser, 30).until(EC.presence_of_element_located((By.ID, "workers")))
        browser.get(f"{url}/admin/jobs/{job_id}")
        link = browser.find_element(By.ID, "reconnecting")
        assert not link.is_displayed()
        os.kill(worker.proc.pid, signal.SIGCONT)
        WebDriverWait(browser, 60, poll_frequency=0.02).until(lambda b: int(shown(b, "tokens")) >= 3)
        os.kill(worker.proc.pid, signal.SIGSTOP)   # mid-job: the text so far is on the page
        written = Redis.from_url(redis_server.url).xlen(protocol.stream_key(job_id))   # its token records
        WebDriverWait(browser, 10).until(lambda b: shown(b, "tokens") == str(written))
        before = shown(browser, "output")
        assert shown(browser, "state") == "running"
        redis_server.stop()
        WebDriverWait(browser, 30).until(lambda b: link.is_displayed() or shown(b, "state") != "running")
        assert (shown(browser, "state"), link.text) == ("running", "reconnecting to the job's stream")
        assert not browser.find_element(By.ID, "error-row").is_displayed()
        time.sleep(3)   # tries that get the web app's 503 keep it reconnecting
        assert (shown(browser, "state"), link.is_displayed(), shown(browser, "output")) == ("running", True, before)

        redis_server.start()
        os.kill(worker.proc.pid, signal.SIGCONT)
        done = wait_for(url, job_id)
        assert done["state"] == "finished", done
        WebDriverWait(browser, 60).until(lambda b: shown(b, "state") != "running")
        assert shown(browser, "state") == "finished"
        assert shown(browser, "output") == done["output"] and done["output"].startswith(before)
        records = Redis.from_url(redis_server.url).xrange(protocol.stream_key(job_id))
        assert shown(browser, "tokens") == str(sum(fields[b"type"] == b"token" for _, fields in records))
        assert not link.is_displayed()
        assert not browser.find_element(By.ID, "error-row").is_displayed()
    finally:   # so that the worker can stop
        os.kill(worker.proc.pid, signal.SIGCONT)
        if redis_server.proc.poll() is not None:
            redis_server.start()
