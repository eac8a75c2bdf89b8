#!/usr/bin/env python3
"""The dashboard (`coli web`) in a real headless Chromium against the real colibrid.

Started by tools/web_e2e.sh (CI), which installs Debian's chromium and chromium-driver and
the pinned selenium package. The daemon serves a tiny GLM-4.5-shaped fixture with a small
expert cache, so the grid shows experts on disk, being read and cached. Checks:

- the page loads with no console errors (and no request leaves this machine: the page's
  Content-Security-Policy would refuse one, and Chromium reports that as an error);
- a chat message typed and sent with the keyboard gets a reply that streams in;
- the grid has layers x experts cells (the fixture's config), and cells change after a reply;
- Stop (the Escape key) cancels a long reply: it stops growing, the daemon frees the slot;
- the conversation is a daemon session: listed after a reload, reopened with its messages;
- keep-alive and pinning from the Models pane reach the daemon;
- at phone width the panes become tabs;
- a page of another origin (another loopback port, and `localhost` for a cross-site one)
  cannot drive the API: its `fetch(..., {mode: "no-cors"})` POSTs and its form POSTs are
  refused (403), the daemon's Prometheus counters show that no prompt token was read and no
  step ran, and the model and its pins are unchanged.

Screenshots (desktop 1280x800 and phone width) go to --artifacts. It also draws a GLM-5
shaped grid (78 x 256) from a synthetic snapshot and prints how long its updates take
(printed, not asserted: timings are measured in benchmarks, not tests).
"""

import argparse
import http.server
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def wait_for(fn, timeout=20, what="condition", poll=0.05):
    end = time.time() + timeout
    last = None
    while time.time() < end:
        try:
            last = fn()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - a page still settling
            last = e
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def api(base, path, body=None, method=None):
    req = urllib.request.Request(base + path, method=method or ("POST" if body is not None else "GET"))
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        req.add_header("content-type", "application/json")
    with urllib.request.urlopen(req, data, timeout=30) as r:
        return json.loads(r.read())


def metrics(base):
    """The daemon's Prometheus text as {series: value}."""
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def total(m, prefix):
    return sum(v for k, v in m.items() if k.startswith(prefix))


ATTACK_PAGE = """<!doctype html><meta charset=utf-8><title>some page</title>
<iframe name=sink></iframe>
<form id=chat target=sink method=POST enctype=text/plain action="API/v1/chat/completions">
<input name='{"model":"MODEL","max_tokens":8,"messages":[{"role":"user","content":"hi"}],"x":"' value='"}'>
</form>
<form id=unload target=sink method=POST action="API/api/models/unload"><input name=model value="MODEL"></form>
"""


def serve_attack_page(api, model):
    """A page on another loopback port: what a site the user visits could serve."""
    page = ATTACK_PAGE.replace("API", api).replace("MODEL", model).encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def cross_origin_attack(driver, base, model, pins_before):
    """Another origin's page sends what a browser sends without a preflight."""
    srv = serve_attack_page(base, model)
    port = srv.server_address[1]
    try:
        before = metrics(base)
        # 127.0.0.1 on another port is the same site, another origin; localhost is another site.
        for host in ("127.0.0.1", "localhost"):
            driver.get(f"http://{host}:{port}/")
            statuses = driver.execute_async_script("""
                const [api, model, done] = arguments;
                const chat = JSON.stringify({model, max_tokens: 8, messages: [{role: "user", content: "hi"}]});
                Promise.allSettled([
                  fetch(api + "/v1/chat/completions", {method: "POST", mode: "no-cors", body: chat}),
                  fetch(api + "/v1/completions", {method: "POST", mode: "no-cors",
                        body: JSON.stringify({model, prompt: "hi", max_tokens: 8})}),
                  fetch(api + "/v1/messages", {method: "POST", mode: "no-cors", body: chat,
                        headers: {"content-type": "text/plain"}}),
                  fetch(api + "/api/models/unload", {method: "POST", mode: "no-cors",
                        body: JSON.stringify({model})}),
                  fetch(api + "/api/unpin", {method: "POST", mode: "no-cors", body: JSON.stringify({model})}),
                  fetch(api + "/metrics", {mode: "no-cors"}),
                ]).then(r => done(r.map(x => x.status)));
            """, base, model)
            check(len(statuses) == 6, f"the {host} page sent its no-cors requests ({statuses})")
            driver.execute_script("document.getElementById('chat').submit()")
            time.sleep(0.5)
            driver.execute_script("document.getElementById('unload').submit()")
            time.sleep(0.5)
        after = wait_for(lambda: (lambda m: m if total(m, 'colibri_http_requests_total{route="/v1/chat/completions",code="403"}') >= 4 else None)(metrics(base)),
                         10, "the refusals counted")
        refused = {k: v - before.get(k, 0) for k, v in after.items()
                   if k.startswith("colibri_http_requests_total") and v != before.get(k, 0)}
        print(f"note cross-origin requests answered: {refused}", flush=True)
        check(all('code="403"' in k for k in refused if 'route="/v1' in k or 'route="/api"' in k),
              "every request of the other origins' pages to /v1 and /api was answered 403")
        check(total(refused, 'colibri_http_requests_total{route="/v1/chat/completions",code="403"}') >= 4,
              "the no-cors fetch and the form POST to /v1/chat/completions reached the daemon and were refused")
        check(total(refused, 'colibri_http_requests_total{route="/metrics",code="403"}') >= 2,
              "the other origins' pages may not read /metrics either")
        for series in ("colibri_prompt_tokens_total", "colibri_steps_total", "colibri_generations_total",
                       "colibri_generated_tokens_total"):
            check(total(after, series) == total(before, series),
                  f"{series} unchanged: no generation started ({total(before, series)} -> {total(after, series)})")
        status = api(base, "/api/status")
        check(len(status["models"]) == 1, "the model is still loaded")
        check(status["models"][0]["cache"]["pinned_experts"] == pins_before,
              f"its {pins_before} pins are still there")
        # The refused loads are logged on the other page's console: drain them, they are not
        # the dashboard's.
        console_errors(driver)
    finally:
        srv.shutdown()


def console_errors(driver):
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release", help="folder with coli and colibrid")
    ap.add_argument("--fixture", default="tests/fixtures/glm4_moe")
    ap.add_argument("--artifacts", default="target/artifacts/web")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    ap.add_argument("--chromedriver", default=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    a = ap.parse_args()
    os.makedirs(a.artifacts, exist_ok=True)
    work = tempfile.mkdtemp(prefix="colibri-web-")
    sock = os.path.join(work, "c.sock")
    env = dict(os.environ)
    # A pause after each engine step: the fixture is tiny and would answer in a blink.
    env["COLIBRI_STEP_PAUSE_MS"] = "30"
    log = open(os.path.join(a.artifacts, "colibrid.log"), "w")
    daemon = subprocess.Popen(
        [os.path.join(a.bin, "colibrid"), "--socket", sock, "--state-dir", os.path.join(work, "state")],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    driver = None
    try:
        wait_for(lambda: os.path.exists(sock), 30, "the daemon's socket")
        # `coli web` loads the fixture with a 48 KiB expert cache (4 of its 16 experts) and
        # starts the HTTP listener; --no-open: this test is the browser.
        out = subprocess.run(
            [os.path.join(a.bin, "coli"), "--socket", sock, "--no-autostart", "web", "--model", a.fixture,
             "--expert-cache", "48K", "--http", "127.0.0.1:0", "--no-open", "--output", "json"],
            check=True, capture_output=True, text=True, env=env, timeout=120)
        served = json.loads(out.stdout)
        page = served["url"]
        base = page.rstrip("/")
        model = served["models"][0]["name"]
        check(served["opened"] is False and page.endswith("/"), f"coli web serves the page at {page}")
        cfg = json.load(open(os.path.join(a.fixture, "config.json")))
        layers = cfg["num_hidden_layers"]
        experts = cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts")

        opts = Options()
        opts.binary_location = a.chromium
        for flag in ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--disable-dev-shm-usage", "--window-size=1280,800",
                     f"--user-data-dir={os.path.join(work, 'chrome-profile')}"]:
            opts.add_argument(flag)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=Service(a.chromedriver), options=opts)

        def viewport(w, hgt, mobile=False):
            # The page's own viewport, exactly (a window size would include the frame).
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                   {"width": w, "height": hgt, "deviceScaleFactor": 1, "mobile": mobile})
            time.sleep(0.3)

        viewport(1280, 800)
        driver.get(page)
        wait_for(lambda: driver.execute_script("return window.colibri && window.colibri.grid().layers") > 0,
                 20, "the grid's snapshot")
        wait_for(lambda: "live" in driver.find_element(By.ID, "conn").text, 20, "the live stream")
        g = driver.execute_script("return window.colibri.grid()")
        canvas = driver.find_element(By.ID, "grid")
        check(g["layers"] == layers and g["experts"] == experts,
              f"the grid has {layers} layers x {experts} experts (got {g['layers']} x {g['experts']})")
        check(canvas.get_attribute("data-layers") == str(layers) and canvas.get_attribute("data-experts") == str(experts),
              "the canvas says its shape")
        check(len(g["cells"]) == layers * experts, "one cell per (layer, expert)")
        dense = cfg.get("first_k_dense_replace", 0)
        check(all(c == 0 for c in g["cells"][: dense * experts]) and all(c != 0 for c in g["cells"][dense * experts:]),
              f"the {dense} dense layer(s) have no cells, the MoE layers all have theirs")
        errs = console_errors(driver)
        check(not errs, f"the page loaded with no console errors {errs}")

        # --- a chat message, sent from the keyboard, streams a reply ---------------------
        before = g
        pixels_before = driver.execute_script(
            "const c=document.getElementById('grid');return c.toDataURL().length+':'+c.toDataURL().slice(-200)")
        # The settings fold open from the keyboard.
        driver.find_element(By.CSS_SELECTOR, "#settings summary").send_keys(Keys.ENTER)
        driver.find_element(By.ID, "max-tokens").send_keys("24")
        box = driver.find_element(By.ID, "prompt")
        box.click()
        box.send_keys("Tell me about the sea")
        box.send_keys(Keys.ENTER)
        lengths = []

        def reply_done():
            body = driver.execute_script(
                "const m=document.querySelectorAll('.msg-assistant');const l=m[m.length-1];"
                "return l?[l.querySelector('.body').textContent.length,!l.querySelector('.reply-stats').hidden]:null")
            if body:
                if not lengths or lengths[-1] != body[0]:
                    lengths.append(body[0])
                return body[1]
            return False

        wait_for(reply_done, 60, "the first reply", poll=0.02)
        stats = driver.find_element(By.CSS_SELECTOR, ".msg-assistant .reply-stats").text
        reply = driver.find_element(By.CSS_SELECTOR, ".msg-assistant .body").text
        check(len(reply) > 0, f"a reply came: {reply[:60]!r}")
        check(len([x for x in lengths if x > 0]) >= 3, f"it streamed in pieces (text lengths seen: {lengths[:12]})")
        check("tok/s" in stats and "TTFT" in stats and "tokens" in stats and "cached" in stats,
              f"the reply shows its figures: {stats!r}")
        time.sleep(0.2)
        check(not driver.find_elements(By.CSS_SELECTOR, ".msg-assistant .body.cursor"),
              "the finished reply shows no typing cursor")
        user = driver.find_element(By.CSS_SELECTOR, ".msg-user").text
        check(user == "Tell me about the sea", "the user's message is shown")

        def grid_moved():
            g2 = driver.execute_script("return window.colibri.grid()")
            return g2 if sum(g2["uses"]) > sum(before["uses"]) and g2["observed"] != before["observed"] else None

        after = wait_for(grid_moved, 10, "the grid to show the reply's routing")
        changed = [i for i in range(len(after["cells"]))
                   if after["cells"][i] != before["cells"][i] or after["uses"][i] != before["uses"][i]]
        check(len(changed) > 0, f"{len(changed)} cells changed after the reply")
        check(any(after["cells"][i] in (1, 2, 3) for i in range(len(after["cells"]))) and
              any(c == 3 for c in after["cells"]), "streamed cells are cached or on disk")
        check(sum(len(x) for x in after["last"]) > 0, f"the last token's experts are known: {after['last']}")
        time.sleep(0.3)
        pixels_after = driver.execute_script(
            "const c=document.getElementById('grid');return c.toDataURL().length+':'+c.toDataURL().slice(-200)")
        check(pixels_after != pixels_before, "the grid's pixels changed")
        status = api(base, "/api/status")
        sess = [s for s in status["sessions"] if s["messages"] >= 2]
        check(len(sess) == 1, f"the conversation is a daemon session ({[s['id'] for s in status['sessions']]})")
        sid = sess[0]["id"] if sess else None
        driver.save_screenshot(os.path.join(a.artifacts, "desktop-1280x800.png"))

        # --- how a reply is rendered: Markdown, code, thinking folded, never HTML ---------
        html = driver.execute_script("return window.colibri.renderReply(arguments[0])",
                                     "<think>pondering the sea</think>Here:\n```python\nprint('<b>hi</b>')\n```\n"
                                     "- **bold** and `x < y`\n- <script>alert(1)</script> [site](https://example.org)")
        check('<details class="thinking">' in html and "pondering the sea" in html, f"thinking is folded: {html[:120]}")
        check('<code class="lang-python">print(\'&lt;b&gt;hi&lt;/b&gt;\')</code>' in html, "a fenced code block")
        check("<li><strong>bold</strong> and <code>x &lt; y</code></li>" in html, "a list with bold and inline code")
        check("<script>" not in html and "&lt;script&gt;" in html, "HTML in a reply stays text")
        check('rel="noopener noreferrer"' in html, "links open apart")
        html = driver.execute_script("return window.colibri.renderReply(arguments[0])", "still thinking</think>The answer.")
        check("still thinking" in html and "<p>The answer.</p>" in html, "a lone </think> ends the thinking")

        # --- keyboard: the grid's cursor ------------------------------------------------
        driver.execute_script("document.getElementById('grid').focus()")
        driver.switch_to.active_element.send_keys(Keys.ARROW_DOWN, Keys.ARROW_RIGHT)
        info = driver.find_element(By.ID, "cell-info").text
        check(info.startswith("Layer 2, expert 1:"), f"the arrow keys move the grid's cursor (from the first MoE layer): {info!r}")

        # --- Stop cancels a long reply --------------------------------------------------
        mt = driver.find_element(By.ID, "max-tokens")
        mt.clear()
        mt.send_keys("200")
        box = driver.find_element(By.ID, "prompt")
        box.click()
        box.send_keys("Write a long story about a lighthouse")
        box.send_keys(Keys.ENTER)

        def streaming_some():
            t = driver.execute_script(
                "const m=document.querySelectorAll('.msg-assistant');return m.length>=2?m[m.length-1].querySelector('.body').textContent.length:0")
            return t > 20

        wait_for(streaming_some, 30, "the long reply to start")
        check(driver.find_element(By.ID, "stop").is_enabled(), "Stop is enabled while the reply streams")
        driver.switch_to.active_element.send_keys(Keys.ESCAPE)
        wait_for(lambda: "stopped" in driver.find_elements(By.CSS_SELECTOR, ".msg-assistant .reply-stats")[-1].text,
                 10, "the reply to say it was stopped")
        n1 = len(driver.find_elements(By.CSS_SELECTOR, ".msg-assistant .body")[-1].text)
        freed = wait_for(lambda: all(m["active"] == 0 and m["queued"] == 0 for m in api(base, "/api/status")["models"]),
                         5, "the daemon to free the slot")
        check(bool(freed), "the daemon runs no generation after Stop")
        time.sleep(1.0)
        n2 = len(driver.find_elements(By.CSS_SELECTOR, ".msg-assistant .body")[-1].text)
        check(n1 == n2, f"the stopped reply stays as it was ({n1} -> {n2} characters)")
        s2 = [s for s in api(base, "/api/status")["sessions"] if s["id"] == sid]
        check(bool(s2) and s2[0]["state"] != "generating" and s2[0]["messages"] == 4,
              f"the session is idle and kept the stopped reply ({s2})")
        stopped = driver.find_elements(By.CSS_SELECTOR, ".msg-assistant .reply-stats")[-1].text
        import re
        n_tok = int(re.search(r"(\d+) tokens", stopped).group(1))
        check(0 < n_tok < 150, f"the reply was cut well before its 200 tokens: {stopped!r}")
        check(driver.find_element(By.ID, "send").is_enabled() and not driver.find_element(By.ID, "stop").is_enabled(),
              "Send is back, Stop is off")

        # --- conversations are the daemon's sessions --------------------------------------
        driver.refresh()
        wait_for(lambda: driver.find_elements(By.ID, f"so-{sid}"), 20, "the session in the list")
        title = driver.find_element(By.ID, f"so-{sid}").text
        check("Tell me about the sea" in title, f"the conversation is listed by its first message: {title!r}")
        driver.find_element(By.ID, f"so-{sid}").send_keys(Keys.ENTER)
        wait_for(lambda: len(driver.find_elements(By.CSS_SELECTOR, ".msg-user")) == 2, 20, "the conversation to reopen")
        check(len(driver.find_elements(By.CSS_SELECTOR, ".msg-assistant")) == 2, "both replies are back")

        # --- the Models pane: keep-alive and pins reach the daemon ------------------------
        from selenium.webdriver.support.ui import Select
        key = "".join(ch if ch.isalnum() or ch in "_-" else "_" for ch in model)
        Select(driver.find_element(By.ID, f"mks-{key}")).select_by_value("300")
        wait_for(lambda: api(base, "/api/status")["models"][0]["keep_alive_seconds"] == 300, 10, "keep-alive 300 s")
        check(True, "keep-alive set from the page")

        # The page rebuilds the model card once its next status poll sees the new keep-alive
        # (the controls are replaced): act on the rebuilt card, not on one about to go.
        def card_has_keep_alive():
            sig = driver.execute_script("return document.getElementById('model-list').dataset.sig")
            card = json.loads(sig)[2][0]
            return card[1] is True and round(card[2]) == 300
        wait_for(card_has_keep_alive, 10, "the model card rebuilt with keep-alive 300")
        hot = driver.find_element(By.ID, f"mph-{key}")
        hot.clear()
        hot.send_keys("3")
        driver.find_element(By.ID, f"mp-{key}").click()
        wait_for(lambda: api(base, "/api/status")["models"][0]["cache"]["pinned_experts"] == 3, 10, "3 pins")
        pinned = wait_for(lambda: sum(1 for c in driver.execute_script("return window.colibri.grid()")["cells"] if c in (4, 5)) == 3,
                          10, "3 pinned cells in the grid")
        check(bool(pinned), "pinning the 3 hottest shows 3 pinned cells")
        driver.save_screenshot(os.path.join(a.artifacts, "desktop-1280x800-pinned.png"))

        errs = console_errors(driver)
        check(not errs, f"no console errors after the chat, stop, reload and pins {errs}")

        # --- another origin's page cannot drive the API -----------------------------------
        cross_origin_attack(driver, base, model, 3)
        driver.get(page)
        wait_for(lambda: "live" in driver.find_element(By.ID, "conn").text, 20, "the live stream again")

        # --- phone width: one pane at a time, chosen by tabs -----------------------------
        viewport(390, 844, mobile=True)
        tabs_visible = driver.find_element(By.ID, "tab-experts").is_displayed()
        check(tabs_visible, "tabs appear at phone width")
        check(driver.find_element(By.ID, "pane-chat").is_displayed() and not driver.find_element(By.ID, "pane-experts").is_displayed(),
              "the chat alone is shown")
        driver.save_screenshot(os.path.join(a.artifacts, "phone-390-chat.png"))
        driver.find_element(By.ID, "tab-chat").send_keys(Keys.ARROW_RIGHT)
        wait_for(lambda: driver.find_element(By.ID, "pane-experts").is_displayed(), 5, "the experts tab")
        width = driver.execute_script("return document.getElementById('grid').getBoundingClientRect().width")
        scroll = driver.execute_script("return document.documentElement.scrollWidth")
        check(width <= 390 and scroll <= 390, f"the grid fits the phone's width ({width:.0f}px, page {scroll}px)")
        time.sleep(0.3)
        driver.save_screenshot(os.path.join(a.artifacts, "phone-390-experts.png"))
        driver.find_element(By.ID, "tab-experts").send_keys(Keys.ARROW_RIGHT)
        wait_for(lambda: driver.find_element(By.ID, "pane-models").is_displayed(), 5, "the models tab")
        driver.save_screenshot(os.path.join(a.artifacts, "phone-390-models.png"))

        # --- GLM-5's shape: 78 layers x 256 experts from a synthetic snapshot --------------
        viewport(1280, 800)
        rng = random.Random(5)
        L, E = 78, 256
        cells, uses = [], []
        for layer in range(L):
            for e in range(E):
                if layer < 3:
                    cells.append("0"); uses.append(0)
                    continue
                u = int(rng.paretovariate(1.2)) - 1
                uses.append(u)
                cells.append("3" if u > 3 and rng.random() < 0.7 else ("4" if u > 40 and rng.random() < 0.3 else "1"))
        last = [[] if layer < 3 else sorted(rng.sample(range(E), 8)) for layer in range(L)]
        snap = {"grid": {"layers": L, "experts": E, "cells": "".join(cells), "uses": uses, "last": last, "observed": 1}}
        ms = driver.execute_async_script("""
            const [snap, L, E, done] = arguments;
            window.colibri.stopLive();
            window.colibri.applySnapshot(snap);
            let seed = 7; const rnd = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
            const frames = 120; let n = 0; const t0 = performance.now();
            const step = () => {
              const cells = [], uses = [];
              for (let k = 0; k < 600; k++) { const i = 3 * E + Math.floor(rnd() * (L - 3) * E); cells.push(i, 1 + Math.floor(rnd() * 3)); uses.push(i, 50 + n); }
              const last = []; for (let l = 0; l < L; l++) { const r = []; if (l >= 3) for (let k = 0; k < 8; k++) r.push(Math.floor(rnd() * E)); last.push(r); }
              window.colibri.applyDelta({cells, uses, last, observed: n + 2});
              if (++n < frames) requestAnimationFrame(step); else done((performance.now() - t0) / frames);
            };
            requestAnimationFrame(step);
        """, snap, L, E)
        g5 = driver.execute_script("return window.colibri.grid()")
        check(g5["layers"] == 78 and g5["experts"] == 256 and len(g5["cells"]) == 78 * 256,
              "a GLM-5-shaped grid (78 x 256 = 19968 cells) is drawn on one canvas")
        print(f"note GLM-5 shape: 120 updates of 600 cells each, {ms:.1f} ms per animation frame "
              f"(60 Hz = 16.7 ms; headless Chromium, software rendering)", flush=True)
        time.sleep(0.8)
        driver.save_screenshot(os.path.join(a.artifacts, "desktop-1280x800-glm5-shape.png"))
        errs = console_errors(driver)
        check(not errs, f"no console errors at the end {errs}")
    finally:
        if driver is not None:
            try:
                driver.quit()
            except Exception:  # noqa: BLE001
                pass
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()
        shutil.rmtree(work, ignore_errors=True)
    if FAILURES:
        print(f"web_e2e: {len(FAILURES)} failed: {FAILURES}")
        sys.exit(1)
    print(f"web_e2e: all checks passed; screenshots in {a.artifacts}")


if __name__ == "__main__":
    main()
