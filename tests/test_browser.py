"""The report in a real browser: Debian's chromium, headless, driven over the
DevTools protocol on a pipe (``--remote-debugging-pipe``: JSON messages ended by
NUL on fds 3 and 4), so no websocket library or driver is needed.

Checks that the page renders, that every image decodes, and that nothing is
logged as an error (console, uncaught exceptions, blocked or failed loads,
CSP violations). A canary page with a deliberate error and a missing image
runs first, so a detector that sees nothing cannot pass by accident. A
full-page screenshot is kept under test-artifacts/."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from attnscale import report

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--remote-debugging-pipe", "about:blank"]
# every image decoded (decode() rejects a broken one), and what the page holds
PROBE = """(async () => {
  const imgs = [...document.images];
  const broken = [];
  await Promise.all(imgs.map(i => i.decode().catch(() => broken.push(i.alt || i.src.slice(0, 60)))));
  return {images: imgs.length, ok: imgs.filter(i => i.complete && i.naturalWidth > 0).length, broken,
          tables: document.querySelectorAll('table').length, h2: document.querySelectorAll('h2').length,
          title: document.title, height: document.documentElement.scrollHeight};
})()"""


def _chromium() -> str | None:
    for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class Browser:
    """A headless chromium and one page, spoken to over the DevTools pipe."""

    def __init__(self, exe: str, profile: Path, log: Path):
        to_r, self._to_w = os.pipe()  # we write, chromium reads on fd 3
        self._from_r, from_w = os.pipe()  # chromium writes on fd 4

        # the protocol wants the pipe at fds 3 and 4, which pass_fds cannot renumber, hence
        # preexec_fn (unsafe only with threads, and this runs before any are started here)
        def wire():  # in the child, before exec
            os.dup2(to_r, 3)
            os.dup2(from_w, 4)

        self._log = open(log, "wb")  # noqa: SIM115 - lives as long as the browser; closed in close()
        self.proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={profile}"], stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=self._log, preexec_fn=wire, pass_fds=(3, 4))
        os.close(to_r)
        os.close(from_w)
        self._buf, self._id, self.events = b"", 0, []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for method in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.call(method, session=self.session)

    def _recv(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_r], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._from_r, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed the pipe (exit {self.proc.poll()})")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, session: str | None = None, timeout: float = 60, **params) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._recv(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def open(self, url: str, timeout: float = 60) -> None:
        self.events.clear()
        self.call("Page.navigate", session=self.session, url=url)
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.events.append(self._recv(deadline))

    def evaluate(self, expression: str):
        res = self.call("Runtime.evaluate", session=self.session, expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"page script failed: {res['exceptionDetails']}")
        return res["result"]["value"]

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error-level log entries seen since ``open``."""
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                out.append("exception: " + p["exceptionDetails"].get("text", "?"))
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(f"log ({p['entry'].get('source')}): {p['entry'].get('text')}")
        return out

    def screenshot(self, path: Path, width: int = 1280) -> Path:
        self.call("Emulation.setDeviceMetricsOverride", session=self.session, width=width, height=900,
                  deviceScaleFactor=1, mobile=False)
        height = self.evaluate("document.documentElement.scrollHeight")
        shot = self.call("Page.captureScreenshot", session=self.session, format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1})
        import base64

        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_w)
        os.close(self._from_r)
        self._log.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    exe = _chromium()
    if exe is None:
        pytest.skip("chromium not found at /usr/bin/chromium or on PATH (Debian: apt-get install -y chromium)")
    tmp = tmp_path_factory.mktemp("chromium")
    b = Browser(exe, tmp / "profile", tmp / "chromium.log")
    yield b
    b.close()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A report from real spread and fresh records at small sizes, plus hand-written training records."""
    from test_report import write_runs

    from attnscale.experiments import fresh, spread

    root = write_runs(tmp_path_factory.mktemp("runs"))
    spread.run(spread.SpreadConfig(widths=(4, 64, 256, 1024), pairs=2000), out=root / "spread")
    fresh.run(fresh.FreshConfig(widths=(4, 64, 256, 1024), sequences=8, init="unit"), out=root / "fresh-unit")
    return report.build(root)


def test_detector_sees_errors_and_broken_images(browser, tmp_path):
    canary = tmp_path / "canary.html"
    canary.write_text('<!DOCTYPE html><html><body><img src="missing.png" alt="gone">'
                      '<script>console.error("canary error")</script></body></html>')
    browser.open(canary.as_uri())
    probe = browser.evaluate(PROBE)
    assert probe["images"] == 1 and probe["ok"] == 0 and probe["broken"] == ["gone"]
    errors = browser.errors()
    assert any("canary error" in e for e in errors), errors


def test_report_renders_with_every_image_and_no_errors(browser, built):
    browser.open(built["html"].resolve().as_uri())
    probe = browser.evaluate(PROBE)
    pngs = [k for k in built if k not in ("html", "markdown")]
    assert probe["images"] == len(pngs) == 5, probe
    assert probe["ok"] == probe["images"] and probe["broken"] == [], probe
    assert probe["tables"] >= 8 and probe["h2"] == 6 and "course" in probe["title"]
    assert probe["height"] > 3000  # laid out, not an empty page
    assert browser.errors() == []
    ARTIFACTS.mkdir(exist_ok=True)
    shot = browser.screenshot(ARTIFACTS / "report.png")
    shutil.copy(built["html"], ARTIFACTS / "report.html")
    assert shot.stat().st_size > 50_000
    print(f"\nscreenshot: {shot}")


def test_page_policy_blocks_scripts_and_fetches_even_if_escaping_failed(browser, built, tmp_path):
    # defence in depth: a copy of the report with raw markup slipped in
    page = built["html"].read_text().replace(
        "</body>", '<img src="https://example.invalid/x.png" alt="remote"><script>document.title = "ran"</script></body>')
    (tmp_path / "tampered.html").write_text(page)
    browser.open((tmp_path / "tampered.html").as_uri())
    assert browser.evaluate("document.title") != "ran"
    assert "remote" in browser.evaluate(PROBE)["broken"]
    errors = browser.errors()
    assert any("Content Security Policy" in e and "script" in e for e in errors), errors
    assert any("Content Security Policy" in e and "example.invalid" in e for e in errors), errors
