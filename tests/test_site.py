"""make site (book/build.py): the course as a static site, built here from the committed notebooks and opened page by
page in Debian's chromium with every request outside the site blocked.

The build itself fails on a broken link or a missing section (Sphinx's warnings are errors); this reads what it wrote:
every local link, anchor and image resolves, every page loads without a console error or a request outside the site,
the widgets render from their saved state, and the offline search finds a lesson's word. Screenshots of the front
page, a lesson with a figure and the widget page land in artifacts/site/.
"""
import functools
import http.server
import importlib.util
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from browser import CHROMIUM, chromium
from conftest import ROOT

SCREENSHOTS = ROOT / "artifacts" / "site"
WIDGET_PAGES = ["notebooks/02b_ring_allreduce_from_scratch.html", "notebooks/05_distributed_sampler.html"]
SHOWN = {  # screenshot name: (page, what to scroll to first)
    "front_page": ("index.html", None),
    "lesson_with_a_figure": ("notebooks/04_ddp_training.html", ".cell_output img"),
    "widget_page": ("notebooks/05_distributed_sampler.html", ".cell_output .widget-slider"),
}
REFERENCE = re.compile(r"""<(a|link|script|img|iframe|source)\b[^>]*?\b(href|src)="([^"]*)\"""")


def needs(what: str, ok: bool):
    if not ok:
        message = f"site test: {what} missing (make setup installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs it: a skip there would hide a broken set-up
        pytest.skip(message)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    needs("sphinx (the site extra)", importlib.util.find_spec("sphinx") is not None)
    out = tmp_path_factory.mktemp("site") / "site"
    done = subprocess.run([sys.executable, str(ROOT / "book" / "build.py"), "--out", str(out)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def served(site):
    """The site over HTTP on 127.0.0.1, as a reader's browser gets it."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def pages(site: Path) -> list[str]:
    return sorted(str(p.relative_to(site)) for p in site.rglob("*.html") if not p.relative_to(site).parts[0].startswith("_"))


def test_every_notebook_and_reference_page_has_a_page(site):
    built = set(pages(site))
    notebooks = {f"notebooks/{p.stem}.html" for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert notebooks <= built, f"no page for {notebooks - built}"
    assert {"index.html", "CHEATSHEET.html", "exercises/README.html", "ddp_scripts/README.html", "search.html"} <= built


def test_every_local_link_anchor_and_image_resolves(site):
    """Read from the HTML: each relative href and src names a file of the site, each #anchor an id on its page;
    nothing a page loads (a script, a style, an image, a frame) comes from outside the site."""
    ids = {}
    broken, outside = [], []
    for page in pages(site):
        text = (site / page).read_text()
        for tag, attribute, target in REFERENCE.findall(text):
            parts = urlsplit(target)
            if parts.scheme or target.startswith("//"):
                if tag != "a":
                    outside.append(f"{page}: <{tag} {attribute}={target}>")
                continue
            if not parts.path and not parts.fragment:
                continue
            where = (site / page).parent / unquote(parts.path) if parts.path else site / page
            where = where.resolve()
            if where.is_dir():
                where = where / "index.html"
            if not where.is_file():
                broken.append(f"{page}: {target}")
            elif parts.fragment and where.suffix == ".html":
                if where not in ids:
                    ids[where] = set(re.findall(r'\bid="([^"]+)"', where.read_text()))
                if unquote(parts.fragment) not in ids[where]:
                    broken.append(f"{page}: {target} (no such section)")
    assert broken == [], f"{len(broken)} links lead nowhere: {broken[:10]}"
    assert outside == [], f"pages load from outside the site: {outside[:10]}"


def test_the_cheatsheet_links_land_on_lesson_sections(site):
    """Every row of CHEATSHEET.md links a lesson section; on the site each lands on that section's heading."""
    written = re.findall(r"\]\(notebooks/[\w.-]+\.ipynb#", (ROOT / "CHEATSHEET.md").read_text())
    html = (site / "CHEATSHEET.html").read_text()
    landed = re.findall(r'href="(notebooks/[\w.-]+\.html#[^"]+)"', html)
    assert len(landed) == len(written) > 30
    for link in set(landed):
        page, anchor = link.split("#")
        assert re.search(rf'<section id="{re.escape(anchor)}"', (site / page).read_text()), link


@pytest.fixture(scope="module")
def browser():
    needs("/usr/bin/chromium", Path(CHROMIUM).exists())
    needs("playwright", importlib.util.find_spec("playwright") is not None)
    with chromium() as browser:
        yield browser


def test_every_page_in_a_browser(site, served, browser):
    """No console error, no request outside 127.0.0.1, every image loaded, the widgets drawn from their saved
    state; then the search page finds a word of lesson 08; a lesson's outputs wrap, its code has copy buttons, its
    notebook a download link; and a widget page opened as a file (file://) draws its widgets too."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    blocked, problems = [], []
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith((served, site.as_uri()))
                  else (blocked.append(route.request.url), route.abort()))
    page = context.new_page()
    page.on("console", lambda message: message.type == "error" and problems.append(f"{page.url}: {message.text}"))
    page.on("pageerror", lambda error: problems.append(f"{page.url}: {error}"))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shown = {path: (name, target) for name, (path, target) in SHOWN.items()}
    for path in pages(site):
        page.goto(f"{served}/{path}", wait_until="load")
        if path in WIDGET_PAGES:
            page.wait_for_selector(".cell_output .widget-slider", timeout=15_000)
        unloaded = page.eval_on_selector_all("img", "images => images.filter(i => !i.naturalWidth).map(i => i.src)")
        problems += [f"{path}: image not loaded: {src}" for src in unloaded]
        if path in shown:
            name, target = shown[path]
            if target:
                page.locator(target).first.scroll_into_view_if_needed()
            page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=False)
    page.goto(f"{served}/search.html?q=SyncBatchNorm", wait_until="load")
    page.wait_for_selector("#search-results a[href*='08_syncbatchnorm']", timeout=15_000)
    # What a reader needs of a lesson page: its outputs wrap in the column (the doctor's lines are ~400 characters),
    # a copy button on each block of code, the notebook to download
    page.goto(f"{served}/notebooks/14b_the_ddp_doctor.html", wait_until="load")
    wide = page.eval_on_selector_all(".cell_output pre", "pres => pres.filter(p => p.scrollWidth > p.clientWidth + 1)"
                                                       ".map(p => p.innerText.slice(0, 60))")
    copies = page.locator(".cell_input button.lessons-copy").count()
    downloads = page.locator("a.download[href$='14b_the_ddp_doctor.ipynb']").count()
    assert (wide, copies > 0, downloads) == ([], True, 1), (wide[:3], copies, downloads)
    # Opened as files, as the README invites: the widgets draw from their saved state too
    page.goto((site / WIDGET_PAGES[1]).as_uri(), wait_until="load")
    page.wait_for_selector(".cell_output .widget-slider", timeout=15_000)
    context.close()
    assert blocked == [], f"requests outside the site: {blocked[:5]}"
    assert problems == [], problems[:10]
