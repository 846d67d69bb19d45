"""The chat page of `flm serve` in a real headless browser (Debian's chromium, driven by
selenium through chromedriver): type a message, watch the reply stream in, see tokens/s.
"""

import shutil

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait


def find(*names):
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(f"none of {names} is installed (apt-get install chromium chromium-driver)")


@pytest.fixture
def browser():
    options = Options()
    options.binary_location = find("chromium", "chromium-browser", "google-chrome")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(
        service=Service(executable_path=find("chromedriver")), options=options
    )
    yield driver
    driver.quit()


def test_typed_message_gets_a_streamed_reply(server, browser):
    browser.get(server + "/")
    wait = WebDriverWait(browser, 60)
    wait.until(lambda b: b.find_element(By.ID, "model").text == "stories260K")
    browser.execute_script(
        "document.getElementById('max-tokens').value = 200;"
        "document.getElementById('temperature').value = 0;"
    )
    # Records the length of the reply each time the page has rendered (once per batch of
    # network data), and counts its updates (once per streamed piece).
    browser.execute_script(
        "window.replyLengths = []; window.updates = 0;"
        "new MutationObserver((records) => {"
        "  window.updates += records.length;"
        "  const r = document.querySelectorAll('.message.assistant');"
        "  if (r.length) window.replyLengths.push(r[r.length - 1].textContent.length);"
        "}).observe(document.getElementById('messages'),"
        "  {childList: true, subtree: true, characterData: true});"
    )
    box = browser.find_element(By.ID, "input")
    box.send_keys("Tell me a story about Lily.")
    browser.find_element(By.ID, "send").click()

    user = wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".message.user"))
    assert user[0].text == "Tell me a story about Lily."
    wait.until(
        lambda b: not b.find_element(By.ID, "send").get_property("disabled")
        and b.find_elements(By.CSS_SELECTOR, ".message.assistant")
    )
    reply = browser.find_elements(By.CSS_SELECTOR, ".message.assistant")[-1].text
    assert reply.strip()
    assert not browser.find_elements(By.CSS_SELECTOR, ".message.error")
    assert browser.find_element(By.ID, "speed").text.endswith("tokens/s")
    # Streamed: the reply was shown piece by piece as it arrived (more than one arrival),
    # growing to the final text.
    lengths = [n for n in browser.execute_script("return window.replyLengths;") if n]
    assert len(set(lengths)) > 1, lengths
    assert browser.execute_script("return window.updates;") > 5
    assert lengths == sorted(lengths)
    assert lengths[-1] == len(browser.execute_script(
        "const r = document.querySelectorAll('.message.assistant');"
        "return r[r.length - 1].textContent;"
    ))
