"""The rag-serve web page (rag_plugin/serving/static/): its files load nothing from the network and never parse
server text as HTML; in headless Chromium (Selenium) against the real ``rag-serve`` over a trained RAG-Token
checkpoint it draws the answer, K passages and the per-token posterior heat map (K rows, T columns, each column
summing to 1) with the answer's pieces coloured by their passage, follows a change of K, and shows an API error
in its error box.

The browser tests skip, saying why, where Chromium, chromedriver or selenium is missing (``.ci/run`` installs the
first two with apt-get when it can). ``RAG_SERVE_SCREENSHOT=path.png`` also saves the answered page there.
"""
import os
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "rag_plugin" / "serving" / "static"
PAGE_IDS = {"question", "ask", "decoding", "k", "answer", "passages", "heatmap", "error", "version"}
QUESTION = "What is the capital of Kakaka?"


class _Refs(HTMLParser):
    """The ids and the src/href values of an HTML file."""

    def __init__(self):
        super().__init__()
        self.ids, self.urls = set(), []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name == "id":
                self.ids.add(value)
            if name in ("src", "href") and value is not None:
                self.urls.append(value)


def _refs() -> _Refs:
    refs = _Refs()
    refs.feed((STATIC / "index.html").read_text(encoding="utf-8"))
    return refs


def test_page_loads_nothing_from_the_network():
    refs = _refs()
    assert {"static/app.js", "static/style.css"} <= set(refs.urls)
    for url in refs.urls:
        assert not re.match(r"^([a-z][a-z0-9+.-]*:|//)", url, re.I) or url.startswith("data:"), url
        if url.startswith("static/"):
            assert (STATIC / url[len("static/"):]).is_file(), url
    for name in ("index.html", "app.js", "style.css"):
        text = (STATIC / name).read_text(encoding="utf-8")
        assert not re.search(r"https?://|//cdn|@import|[\"'`(]\s*//", text, re.I), name


def test_page_has_the_ids_and_never_parses_server_text_as_html():
    assert PAGE_IDS <= _refs().ids
    script = (STATIC / "app.js").read_text(encoding="utf-8")
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(", script)


def _tools():
    """Chromium and chromedriver's paths, or a skip saying what is missing."""
    browser = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.skip("browser test skipped: chromium and chromedriver are not installed "
                    "(apt-get install chromium chromium-driver; .ci/run does so as root)")
    return browser, driver


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    webdriver = pytest.importorskip("selenium.webdriver", reason="browser test skipped: selenium is not installed")
    chromium, chromedriver = _tools()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1000", f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=chromedriver))
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 1280, "height": 1000, "deviceScaleFactor": 1, "mobile": False})
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def server(token_server):
    """The base URL of tests/serving/conftest.py's rag-serve over rag_token_tiny."""
    return token_server


def open_page(driver, base: str, timeout: float = 30.0):
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(base + "/")
    WebDriverWait(driver, timeout).until(lambda d: d.find_element("tag name", "body").get_attribute("data-ready"))


def ask(driver, question: str, k=None, enter: bool = False, timeout: float = 120.0) -> str:
    """Types ``question`` (with K = ``k`` where given), submits it by the button or Enter, waits for the page to
    draw the reply; returns the page's state, "answer" or "error"."""
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait

    body = driver.find_element("tag name", "body")
    before = int(body.get_attribute("data-requests") or 0)
    if k is not None:
        Select(driver.find_element("id", "k")).select_by_value(str(k))
    box = driver.find_element("id", "question")
    box.clear()
    box.send_keys(question)
    if enter:
        box.send_keys(Keys.ENTER)
    else:
        driver.find_element("id", "ask").click()
    WebDriverWait(driver, timeout).until(lambda d: int(body.get_attribute("data-requests") or 0) == before + 1)
    return body.get_attribute("data-state")


def check_answer(driver, k: int) -> dict:
    """The drawn answer's passages and heat map hold K rows; returns the heat map as {tokens, posterior}."""
    assert not driver.find_element("id", "error").is_displayed()
    assert len(driver.find_elements("css selector", "#passages > li")) == k
    rows = driver.find_elements("css selector", "#heatmap tbody tr")
    tokens = [th.get_attribute("title") for th in driver.find_elements("css selector", "#heatmap thead th.piece")]
    assert len(rows) == k and tokens
    posterior = [[float(td.get_attribute("data-value")) for td in row.find_elements("tag name", "td")] for row in rows]
    assert all(len(values) == len(tokens) for values in posterior)
    for t in range(len(tokens)):
        assert sum(values[t] for values in posterior) == pytest.approx(1.0, abs=1e-3), t
    coloured = driver.find_elements("css selector", "#answer-tokens .tok")
    assert len(coloured) == len(tokens)
    for t, span in enumerate(coloured):
        best = max(range(k), key=lambda i: posterior[i][t])
        assert posterior[int(span.get_attribute("data-passage"))][t] == pytest.approx(posterior[best][t])
        assert span.value_of_css_property("background-color") not in ("", "rgba(0, 0, 0, 0)")
    assert len({s.value_of_css_property("background-color") for s in
                driver.find_elements("css selector", "#legend .swatch")}) == k
    return {"tokens": tokens, "posterior": posterior}


def save_screenshot(driver, tmp_path: Path) -> Path:
    shot = tmp_path / "serve_page.png"
    assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 0
    if os.environ.get("RAG_SERVE_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["RAG_SERVE_SCREENSHOT"])
    return shot


@pytest.mark.slow
def test_page_answers_and_draws_the_posterior(browser, server, tmp_path):
    info = server.get("/v1/info")[1]
    open_page(browser, server.base)
    from selenium.webdriver.support.ui import Select

    assert [o.text for o in Select(browser.find_element("id", "decoding")).options] == info["decodings"]
    k_select = Select(browser.find_element("id", "k"))
    assert k_select.first_selected_option.text == str(info["k"])
    assert len(k_select.options) == info["max_k"]
    assert f"v{info['knowledge']['version']}" in browser.find_element("id", "version").text
    assert info["arch"] in browser.find_element("id", "model").text

    assert ask(browser, QUESTION) == "answer"
    drawn = check_answer(browser, info["k"])
    status, reply = server.post("/v1/answer", {"question": QUESTION, "k": info["k"]})
    assert status == 200 and reply["token_posterior"]["tokens"] == drawn["tokens"]
    assert browser.find_element("id", "answer").get_attribute("textContent") == reply["answer"]
    assert f"v{reply['knowledge_version']}" in browser.find_element("id", "version").text
    save_screenshot(browser, tmp_path)

    other = info["k"] + 1 if info["k"] < info["max_k"] else info["k"] - 1
    assert ask(browser, QUESTION, k=other, enter=True) == "answer"
    check_answer(browser, other)


@pytest.mark.slow
def test_page_shows_an_api_error_in_its_error_box(browser, server):
    status, reply = server.post("/v1/answer", {"question": ""})
    assert status == 422 and reply["error"]
    open_page(browser, server.base)
    assert ask(browser, "") == "error"
    box = browser.find_element("id", "error")
    assert box.is_displayed() and box.get_attribute("textContent").startswith(reply["error"])
    assert not browser.find_element("id", "result").is_displayed()
    assert ask(browser, QUESTION) == "answer" and not box.is_displayed()
