"""The report in a real browser: Debian's chromium, headless, driven by Playwright for
Python through ``executable_path`` (no browser download: Playwright's own browsers
are never installed, and nothing is fetched).

Checks that the page renders, that every image decodes, that nothing is logged
as an error (console, uncaught exceptions, failed loads, CSP violations), that
the CSP holds even where escaping failed, and what a reader sees first: the
scoreboard, then the preset banner and the claims that do not agree. On a
390-px phone the page does not scroll sideways, no backtick shows, and every
figure is at least as wide as its smallest text needs to read 9 px. A canary
page with a deliberate error and a missing image runs first, so a detector that
sees nothing cannot pass by accident. Full-page screenshots, at desktop width
and at 390 px, are kept under test-artifacts/."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from attnscale import report

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
# every image decoded (decode() rejects a broken one), and what the page holds
PROBE = """async () => {
  const imgs = [...document.images];
  const broken = [];
  await Promise.all(imgs.map(i => i.decode().catch(() => broken.push(i.alt || i.src.slice(0, 60)))));
  return {images: imgs.length, ok: imgs.filter(i => i.complete && i.naturalWidth > 0).length, broken,
          tables: document.querySelectorAll('table').length, h2: document.querySelectorAll('h2').length,
          title: document.title, height: document.documentElement.scrollHeight};
}"""


def _chromium() -> str | None:
    for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class Page:
    """One Playwright page and every error it reports: console errors, uncaught exceptions, failed requests."""

    def __init__(self, page):
        self.page, self.events = page, []
        page.on("console", lambda m: self.events.append(f"console: {m.text}") if m.type in ("error", "assert") else None)
        page.on("pageerror", lambda e: self.events.append(f"exception: {e}"))
        # the URL's end names the file (a data: URI is cut short: it is the whole image)
        page.on("requestfailed", lambda r: self.events.append(
            f"request failed: {r.url[:40] + '…' if r.url.startswith('data:') else r.url} ({r.failure})"))

    def open(self, path: Path) -> None:
        self.events.clear()
        self.page.goto(path.resolve().as_uri(), wait_until="load")

    def probe(self) -> dict:
        return self.page.evaluate(PROBE)

    def errors(self) -> list[str]:
        return list(self.events)


@pytest.fixture(scope="module")
def page():
    exe = _chromium()
    if exe is None:
        pytest.skip("chromium not found at /usr/bin/chromium or on PATH (Debian: apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the browser test needs the dev extra (playwright)")
    os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"  # Debian's chromium only; never a download
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        yield Page(context.new_page())
        context.close()
        browser.close()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A report from real spread and fresh records at small sizes, plus hand-written training records
    with the quick preset's settings, where one claim (d=32) differs."""
    from test_report import _as_preset, write_runs

    from attnscale.experiments import fresh, spread

    root = write_runs(tmp_path_factory.mktemp("runs"))
    _as_preset(root, "quick")
    for seed in (0, 1):  # the scaled run ahead at d=32: the sign of the course's claim does not hold
        path = root / "sweep" / f"d32-none-s{seed}" / "record.json"
        rec = json.loads(path.read_text())
        rec["results"]["perplexity"] = 40.7 + 0.1 * seed
        path.write_text(json.dumps(rec))
    spread.run(spread.SpreadConfig(head_dims=(4, 64, 256, 1024), pairs=2000), out=root / "spread")
    fresh.run(fresh.FreshConfig(head_dims=(4, 64, 256, 1024), sequences=8, init="unit"), out=root / "fresh-unit")
    return report.build(root)


def test_detector_sees_errors_and_broken_images(page, tmp_path):
    canary = tmp_path / "canary.html"
    canary.write_text('<!DOCTYPE html><html><body><img src="missing.png" alt="gone">'
                      '<script>console.error("canary error")</script></body></html>')
    page.open(canary)
    probe = page.probe()
    assert probe["images"] == 1 and probe["ok"] == 0 and probe["broken"] == ["gone"]
    errors = page.errors()
    assert any("canary error" in e for e in errors), errors
    assert any("missing.png" in e for e in errors), errors


def test_report_renders_with_every_image_and_no_errors(page, built):
    page.open(built["html"])
    probe = page.probe()
    pngs = [k for k in built if k not in ("html", "markdown")]
    assert probe["images"] == len(pngs) == 5, probe
    assert probe["ok"] == probe["images"] and probe["broken"] == [], probe
    assert probe["tables"] >= 8 and probe["h2"] == 6 and "course" in probe["title"]
    assert probe["height"] > 3000  # laid out, not an empty page
    assert page.errors() == []
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    page.page.screenshot(path=str(shot), full_page=True)
    shutil.copy(built["html"], ARTIFACTS / "report.html")
    assert shot.stat().st_size > 50_000
    print(f"\nscreenshot: {shot}")


def test_a_reader_sees_the_scoreboard_then_the_preset_and_the_claims_that_differ(page, built):
    page.open(built["html"])
    p = page.page
    assert p.locator("h1").inner_text().endswith("(quick preset)")
    board = p.locator("div.scoreboard")
    assert board.count() == 1 and board.is_visible()
    assert board.locator("p").inner_text() == "Scoreboard: 17 agree, 0 partly, 1 differ, 1 not run of 19 claims of the course"
    assert board.locator("li").all_inner_texts() == ["d=32: no difference (unscaled very slightly ahead): differs"]
    banner = p.locator("p.banner")
    assert banner.count() == 1 and "Quick preset" in banner.inner_text()
    assert "not the full reproduction" in banner.inner_text() and banner.is_visible()
    # the scoreboard right under the title, nothing between them; then the banner; the reasons before section 1
    title = p.locator("h1").bounding_box()
    assert board.bounding_box()["y"] - (title["y"] + title["height"]) < 40
    first_h2 = p.locator("h2").first.bounding_box()["y"]
    assert board.bounding_box()["y"] < banner.bounding_box()["y"] < first_h2
    lead = p.locator("p", has_text="Claims that do not agree, and why:")
    assert lead.count() == 1
    items = p.locator("p:has-text('Claims that do not agree, and why:') + ul > li")
    assert items.count() == 1 and "d=32" in items.first.inner_text() and "differs" in items.first.inner_text()
    assert items.first.bounding_box()["y"] < first_h2
    # verdict cells keep their colours; numbers sit right
    assert p.locator("td.v-differs").count() >= 1 and p.locator("td.num").count() > 20
    align = p.locator("td.num").first.evaluate("e => getComputedStyle(e).textAlign")
    assert align == "right"


# the page as a phone shows it: its width, the text a reader can see (closed <details> included),
# and each figure's shown and own width
LAYOUT = """() => ({page: document.documentElement.scrollWidth, screen: document.documentElement.clientWidth,
  text: document.body.textContent, images: [...document.images].map(i => ({alt: i.alt, natural: i.naturalWidth,
  shown: i.getBoundingClientRect().width})), board: document.querySelector('div.scoreboard').getBoundingClientRect().top,
  code: document.querySelectorAll('code').length})"""


@pytest.mark.parametrize("width", [390, 1280])
def test_the_page_fits_the_screen_and_every_figure_reads(page, built, width):
    from attnscale.report import plots

    page.page.set_viewport_size({"width": width, "height": 900})
    try:
        page.open(built["html"])
        got = page.page.evaluate(LAYOUT)
        if width == 390:
            ARTIFACTS.mkdir(exist_ok=True)
            page.page.screenshot(path=str(ARTIFACTS / "report-390.png"), full_page=True)
    finally:
        page.page.set_viewport_size({"width": 1280, "height": 900})
    assert got["page"] <= got["screen"] == width  # no sideways scroll: wide tables and figures scroll in their box
    assert got["code"] >= 4 and "`" not in got["text"]  # inline code is <code> (each section's command), its marks gone
    assert got["board"] < 250  # the scoreboard is on the first screen, under the title
    # every figure's smallest text is plots.MIN_FONT_PT (test_plots holds that), so it reads at 9 px or more
    # on screen exactly when the figure is shown at SMALLEST_SHOWN of its own width or wider: at 390 px
    # a figure squeezed to the screen (max-width: 100%) would fall to about a third and fail here
    assert len(got["images"]) == 5
    for img in got["images"]:
        text_px = plots.MIN_FONT_PT * plots.DPI / 72 * img["shown"] / img["natural"]
        assert text_px >= plots.SCREEN_TEXT_PX - 0.05, (img["alt"], img["shown"], img["natural"], text_px)


def test_markdown_has_no_html_entities(built):
    md = built["markdown"].read_text()
    assert not re.search(r"&(#\d+|#x[0-9a-f]+|[a-z]+);", md, re.I), re.findall(r"&\w+;", md)[:5]
    assert "< 1.5" in md and "> 5,000" in md  # the comparisons read as written
    assert md.splitlines()[2].startswith("**Scoreboard:") and "\n> **Quick preset" in md


def test_page_policy_blocks_scripts_and_fetches_even_if_escaping_failed(page, built, tmp_path):
    # defence in depth: a copy of the report with raw markup slipped in
    text = built["html"].read_text().replace(
        "</body>", '<img src="https://example.invalid/x.png" alt="remote"><script>document.title = "ran"</script></body>')
    (tmp_path / "tampered.html").write_text(text)
    page.open(tmp_path / "tampered.html")
    assert page.page.title() != "ran"
    assert "remote" in page.probe()["broken"]
    errors = page.errors()
    assert any("Content Security Policy" in e and "script" in e for e in errors), errors
    assert any("Content Security Policy" in e and "example.invalid" in e for e in errors), errors


def test_the_scheme_study_section_renders(page, tmp_path):
    """A tiny real study (8 runs): its section, its 4 figures decoded, its table, no console errors."""
    from test_schemes import TINY

    from attnscale.cli import main
    from attnscale.report.schemes_section import TITLE

    runs = tmp_path / "schemes"
    assert main(["schemes", "--widths", "8", "--scale", "none", "qk_norm", "--lrs", "1e-3", "3e-2",
                 "--seeds", "0", "1", *TINY, "--out", str(runs)]) == 0
    built = report.build(runs, tmp_path / "report")
    page.open(built["html"])
    probe = page.probe()
    assert probe["ok"] == probe["images"] == 4 and probe["broken"] == [], probe
    p = page.page
    heading = p.locator("h2", has_text=TITLE)
    assert heading.count() == 1 and heading.is_visible()
    assert p.locator("th", has_text="LR sensitivity ± SE").count() == 1
    assert p.locator("img[alt*='learning rate']").count() >= 1
    # the study's own budget, from its records, and its schemes by the names readers know
    assert p.locator("p", has_text="The study's runs, as their records say: 3 steps a run, context 16, 2 seeds, "
                                   "width 8, learning rates 1e-3 and 3e-2.").count() == 1
    cell = lambda name: p.get_by_role("cell", name=name, exact=True).count()  # noqa: E731
    assert cell("qk-norm") >= 1 and cell("qk_norm") == 0  # run ids keep the registry's name; the scheme column does not
    assert page.errors() == []


def test_a_followed_watch_page_shows_the_log_as_it_grows(page, tmp_path):
    """attnscale watch-report --follow, as a user runs it beside a training job: the open page reloads itself and
    shows each new probe step; Ctrl-C ends the command cleanly."""
    import signal
    import subprocess
    import sys
    import time

    from test_watch_page import _record

    from attnscale.watch.logs.sinks import JsonlSink

    log = tmp_path / "watch.jsonl"
    sink = JsonlSink(log)
    sink.write(_record(10))
    sink.close()
    # a shell that starts the tests in the background leaves SIGINT ignored, and a child inherits that (Python
    # then installs no KeyboardInterrupt): the command gets Ctrl-C's default, as it would from a terminal
    proc = subprocess.Popen([sys.executable, "-m", "attnscale.cli", "watch-report", str(log), "--follow", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    html = log.with_suffix(".html")

    def body_shows(text: str) -> bool:
        """Whether the open page shows ``text`` within 40 s, read between its own reloads."""
        deadline = time.time() + 40
        while time.time() < deadline:
            try:
                if text in page.page.evaluate("document.body ? document.body.innerText : ''"):
                    return True
            except Exception:  # the page reloaded itself while being read: read it again
                pass
            time.sleep(0.2)
        return False

    try:
        deadline = time.time() + 60
        while not html.exists() and time.time() < deadline:
            time.sleep(0.1)
        page.open(html)
        assert body_shows("1 probe steps, 10 to 10")
        with log.open("a", encoding="utf-8") as f:  # the job writes its next probe
            f.write(_record(20).to_line())
        assert body_shows("2 probe steps, 10 to 20")  # no one reopened the page: it reloaded itself
        # a reload cuts the loads in flight short (net::ERR_ABORTED); nothing else may go wrong
        assert [e for e in page.errors() if "ERR_ABORTED" not in e] == []
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert f"page: {html} (2 probe steps, the last at step 20)" in out and "stopped following" in out
