#!/usr/bin/env python3
"""The chat page at / in a real browser: headless Chromium (Debian's
`chromium` + `chromium-driver`) driven by Selenium (PyPI) against a real
`paged serve` with an API key.

  - the page loads with no console error (its Content-Security-Policy
    allows nothing but this server, so any outside fetch would be one) and
    asks for the key; with the key typed in it names the model;
  - a question typed and sent gets an answer that is seen growing while it
    streams, then the reply's stats: tokens, tokens/s, first-token time and
    the finish reason; temperature 0 and max tokens 8 reach the server
    (8 tokens, finished: length);
  - a long answer stopped mid-way stays partial, is marked stopped, and the
    server counts an aborted request;
  - screenshots: build/test-artifacts/webui/*.png (and docs/images/
    webui-chat.png when PAGED_UPDATE_DOCS_SCREENSHOT=1)."""
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_model_and_binary()
su.require_openai()  # re-executes under .venv, where selenium is installed
CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
if not CHROMIUM or not DRIVER:
    su.skip("chromium / chromium-driver are not installed (apt-get install chromium chromium-driver)")
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    su.skip("selenium is not installed in .venv (deploy/quickstart.sh setup)")

KEY = "page-key"
OUT = os.path.join(su.ROOT, "build", "test-artifacts", "webui")
DOCS_PNG = os.path.join(su.ROOT, "docs", "images", "webui-chat.png")


def browser():
    o = webdriver.ChromeOptions()
    o.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=980,720", "--force-device-scale-factor=1", "--no-first-run"):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=DRIVER), options=o)


def set_value(d, elem_id, value):
    e = d.find_element(By.ID, elem_id)
    e.clear()
    e.send_keys(str(value))


def last_reply(d):
    replies = d.find_elements(By.CSS_SELECTOR, ".msg.assistant, .msg.error")
    return replies[-1] if replies else None


def ask(d, text):
    n = len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant, .msg.error"))
    set_value(d, "prompt", text)
    d.find_element(By.ID, "send").click()
    WebDriverWait(d, 30).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant, .msg.error")) > n)
    return last_reply(d)


def text_of(reply):
    return reply.find_element(By.CLASS_NAME, "text").text


def main():
    os.makedirs(OUT, exist_ok=True)
    with su.Server("--api-key", KEY) as srv:
        d = browser()
        try:
            d.get(srv.url + "/")
            assert d.title == "paged chat", d.title
            WebDriverWait(d, 20).until(lambda d: d.find_element(By.ID, "model").text == "API key needed")
            set_value(d, "api-key", KEY)
            d.execute_script("document.getElementById('api-key').dispatchEvent(new Event('change'))")
            WebDriverWait(d, 20).until(lambda d: "model: SmolLM2" in d.find_element(By.ID, "model").text)
            print(f"ok   page loaded, key accepted: {d.find_element(By.ID, 'model').text}")

            # 1. A streamed answer: seen growing, then its stats.
            set_value(d, "temperature", 0)
            set_value(d, "max-tokens", 48)
            # Every change of the reply's text, as the page makes it.
            d.execute_script("""
                window.__seen = [];
                new MutationObserver(() => {
                  const r = [...document.querySelectorAll('.msg.assistant .text')].pop();
                  const t = r ? r.textContent : '';
                  if (t && window.__seen[window.__seen.length - 1] !== t) window.__seen.push(t);
                }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
            """)
            reply = ask(d, "Describe Paris in three sentences.")
            WebDriverWait(d, 120).until(lambda d: reply.get_attribute("data-finish"))
            seen = d.execute_script("return window.__seen")
            final = text_of(reply)
            stats = reply.find_element(By.CLASS_NAME, "stats").text
            assert reply.get_attribute("data-finish") in ("stop", "length"), (reply.get_attribute("data-finish"), stats)
            assert len(seen) >= 3 and seen[-1] == final and all(b.startswith(a) for a, b in zip(seen, seen[1:])), (seen[:5], final)
            assert "tokens/s" in stats and "first token" in stats and "finished:" in stats, stats
            print(f"ok   streamed: {len(seen)} distinct partial texts before the end; {final!r}")
            print(f"ok   stats: {stats}")
            d.save_screenshot(os.path.join(OUT, "chat.png"))

            # 2. The controls reach the server.
            set_value(d, "max-tokens", 8)
            reply = ask(d, "Name a colour.")
            WebDriverWait(d, 60).until(lambda d: reply.get_attribute("data-finish"))
            stats = reply.find_element(By.CLASS_NAME, "stats").text
            assert stats.startswith("8 tokens in") and "finished: length" in stats, stats
            print(f"ok   max tokens 8 -> {stats}")

            # 3. Stop a long answer mid-way.
            before = su.metric(su.metrics(srv.port, {"Authorization": f"Bearer {KEY}"}),
                               "paged:request_success_total", finished_reason="abort")
            set_value(d, "temperature", 0.8)
            set_value(d, "max-tokens", 1500)
            reply = ask(d, "Write a very long story about a lighthouse keeper, with many chapters.")
            WebDriverWait(d, 60).until(lambda d: len(text_of(reply)) > 40)
            assert d.find_element(By.ID, "stop").is_enabled()
            d.find_element(By.ID, "stop").click()
            WebDriverWait(d, 20).until(lambda d: reply.get_attribute("data-finish") == "stopped")
            partial = text_of(reply)
            stats = reply.find_element(By.CLASS_NAME, "stats").text
            assert "stopped" in stats and not d.find_element(By.ID, "stop").is_enabled(), stats
            n_tokens = int(stats.split()[0])
            assert 0 < n_tokens < 1500, stats
            time.sleep(1.0)
            assert text_of(reply) == partial, "text kept growing after stop"
            su.wait_for("the server to count the abort", lambda: (
                (lambda v: (v > before, v))(su.metric(su.metrics(srv.port, {"Authorization": f"Bearer {KEY}"}),
                                                     "paged:request_success_total", finished_reason="abort"))), 30)
            print(f"ok   stopped after {n_tokens} tokens ({len(partial)} chars); the server aborted the request")
            d.save_screenshot(os.path.join(OUT, "chat-stopped.png"))

            # The one expected error: /v1/models before the key was typed
            # (401). A CSP violation or an outside fetch would show here.
            errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE" and
                      not ("/v1/models" in e["message"] and "status of 401" in e["message"])]
            assert not errors, errors
            print("ok   no console errors")
        finally:
            d.quit()
    if os.environ.get("PAGED_UPDATE_DOCS_SCREENSHOT") == "1":
        os.makedirs(os.path.dirname(DOCS_PNG), exist_ok=True)
        shutil.copy(os.path.join(OUT, "chat.png"), DOCS_PNG)
        print(f"wrote {DOCS_PNG}")
    print(f"test_webui_chromium: all passed (screenshots in {OUT})")


if __name__ == "__main__":
    main()
