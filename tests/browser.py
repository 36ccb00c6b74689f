"""Drive JupyterLab in a real browser: open a notebook, clear it, run it, and check what a learner sees.

Used by tests/test_browser.py. Needs Debian's chromium (/usr/bin/chromium) and the playwright
Python package (never `playwright install`: no browser downloads).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
WIDGET_TEXT_FALLBACK = re.compile(r"^(VBox|HBox|IntSlider|Checkbox|HTML|Output)\(")
# IPython renders an uncaught exception (on the stderr mime type) with this header line.
ERROR_HEADER = re.compile(r"^\w+\s+Traceback \(most recent call last\)", re.M)


SETTINGS = {  # user settings for the test server: every cell in the DOM, never write files back
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
}


@contextmanager
def jupyterlab(root: Path):
    """A JupyterLab server on 127.0.0.1 with a token; always stopped, also on failure."""
    settings = root / ".lab-settings"
    for name, values in SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(values))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    log = open(root / ".jupyterlab-test.log", "w") if os.access(root, os.W_OK) else subprocess.DEVNULL
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--ServerApp.allow_root=True", "--LabApp.expose_app_in_browser=True"],  # window.jupyterapp
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(settings)})
    try:
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with code {server.returncode} (see {root}/.jupyterlab-test.log)")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start within 120 s")
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}", token
    finally:
        server.terminate()  # also shuts its kernels down
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait()
        if log is not subprocess.DEVNULL:
            log.close()


@contextmanager
def chromium():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook on screen, not a tab behind it
KERNEL_READY = """() => {
    const context = window.jupyterapp?.shell.currentWidget?.sessionContext;
    const kernel = context?.session?.kernel;
    return Boolean(context?.isReady && kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle');
}"""


def run_command(page, menu: str, command: str):
    """Click a JupyterLab menu item by its command id (e.g. Run > runmenu:run-all)."""
    page.click(f".lm-MenuBar-item:has-text('{menu}')")
    page.click(f".lm-Menu-item[data-command='{command}']")


def open_lab(page, url: str, token: str, workspace: str = "lab") -> None:
    """Load JupyterLab once, with no notebook open (a workspace of its own, reset); the notebooks are then opened in
    it one at a time (open_in_lab). Loading the lab costs a page about 2.7 CPU-s, a notebook opened in it far less."""
    page.goto(f"{url}/lab/workspaces/{workspace}?reset&token={token}")
    page.wait_for_function("() => window.jupyterapp !== undefined", timeout=60_000)
    page.evaluate("async () => { await window.jupyterapp.restored; }")


def open_in_lab(page, notebook: str, kernel: bool = False) -> None:
    """Open a notebook in the loaded lab, as a double-click in the file browser does (docmanager:open), with its
    committed outputs; with its kernel started, or none. A notebook only looked at runs nothing: a kernel for each
    one looked at cost about 12 CPU-s of this test."""
    # JupyterLab starts a kernel on open when the notebook factory's preferKernel (true) says so: set per open.
    page.evaluate("""async ([path, kernel]) => {
        const factory = window.jupyterapp.docRegistry.getWidgetFactory('Notebook');
        Object.defineProperty(factory, 'preferKernel', {value: kernel, configurable: true});
        await window.jupyterapp.commands.execute('docmanager:open', {path});
    }""", [notebook, kernel])
    page.wait_for_selector(f"{PANEL} .jp-CodeCell", timeout=60_000)
    # Until its kernel session is up, JupyterLab marks the first notebook of a page dirty for a moment: closing
    # then asks to save (seen when the machine is busy). Wait for it, as a learner would before closing.
    page.evaluate("async () => { const panel = window.jupyterapp.shell.currentWidget;"
                  " await panel.context.ready; await panel.sessionContext.ready; }")
    if kernel:
        # The toolbar's kernel indicator says "idle" for a moment before any kernel exists (measured: 0.25 s
        # on a quiet machine), and running cells in that moment runs nothing. Wait for the kernel itself.
        page.wait_for_function(KERNEL_READY, timeout=120_000, polling=200)
    else:
        started = page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session?.kernel?.name"
                                " ?? null")
        assert started is None, f"{notebook} started a kernel ({started}) where none was asked for"


def close_all(page, discard: bool = False) -> None:
    """Close every open tab; a notebook that asks to be saved would stop this (a check in itself: none should).
    discard: the notebooks ran, so they changed; close them unsaved (nothing is written back) and stop their kernels."""
    if discard:
        page.evaluate("""async () => {
            for (const panel of window.jupyterapp.shell.widgets('main')) {
                if (!panel.sessionContext) continue;
                panel.context.model.dirty = false;
                await panel.sessionContext.shutdown();
            }
        }""")
    page.evaluate("async () => { await window.jupyterapp.commands.execute('application:close-all'); }")
    try:
        page.wait_for_function("() => !document.querySelector('.jp-NotebookPanel')", timeout=10_000)
    except Exception:
        dialog = page.locator(".jp-Dialog").all_inner_texts()
        raise AssertionError(f"the tabs did not close; dialog: {dialog}") from None


def start_run_all(page, notebook: str) -> None:
    """Open a notebook with its kernel in the loaded lab, clear its outputs, and press Run All (without waiting for
    the end)."""
    open_in_lab(page, notebook, kernel=True)
    run_command(page, "Edit", "editmenu:clear-all")
    page.wait_for_function(f"document.querySelectorAll('{PANEL} .jp-OutputArea-output').length === 0")
    run_command(page, "Run", "runmenu:run-all")


def run_notebook(page, notebook: str, timeout_s: float = 900) -> None:
    start_run_all(page, notebook)
    # Done when every code cell shows an execution count, [n], and the kernel is idle again.
    done = """() => {
        const prompts = [...document.querySelectorAll('PANEL .jp-CodeCell .jp-InputPrompt')];
        return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent)) && (KERNEL_READY)();
    }""".replace("PANEL", PANEL).replace("KERNEL_READY", KERNEL_READY)
    try:
        page.wait_for_function(done, timeout=timeout_s * 1000, polling=1000)
    except Exception as timeout:  # say what the page shows, not only that it timed out
        prompts = page.locator(f"{PANEL} .jp-CodeCell .jp-InputPrompt").all_inner_texts()
        kernel = page.evaluate("() => window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel?.status")
        raise AssertionError(f"{notebook} did not finish in {timeout_s:.0f} s: prompts {prompts}, "
                             f"kernel {kernel}") from timeout


def run_cells(page, notebook: str, cells: list[int], timeout_s: float = 300) -> None:
    """Open a notebook with its kernel in the loaded lab and run these cells (indexes among all its cells) in that
    fresh kernel, one after another, as Ctrl+Enter on each would; every other cell keeps its committed output."""
    open_in_lab(page, notebook, kernel=True)
    page.evaluate("""cells => { (async () => {
        const panel = window.jupyterapp.shell.currentWidget;
        for (const i of cells) {
            panel.content.activeCellIndex = i;
            await window.jupyterapp.commands.execute('notebook:run-cell');
        }
    })(); }""", cells)
    # Done when they show the fresh kernel's counts, 1, 2, ... in the order they ran (the committed counts differ),
    # and the kernel is idle again.
    counts = f"""() => {{
        const cells = window.jupyterapp.shell.currentWidget.content.widgets;
        return {json.dumps(cells)}.map(i => cells[i].model.executionCount);
    }}"""
    expected = json.dumps(list(range(1, len(cells) + 1)), separators=(",", ":"))  # as JSON.stringify writes it
    done = f"() => JSON.stringify(({counts})()) === '{expected}' && ({KERNEL_READY})()"
    try:
        page.wait_for_function(done, timeout=timeout_s * 1000, polling=500)
    except Exception as timeout:
        raise AssertionError(f"{notebook}: cells {cells} did not run in {timeout_s:.0f} s: counts "
                             f"{page.evaluate(counts)}") from timeout


def problems_on_page(page) -> list[str]:
    """What a learner would see as broken: errors, widgets shown as text, images that did not load."""
    found = []
    for text in page.locator(f"{PANEL} .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").all_inner_texts():
        if ERROR_HEADER.search(text):
            found.append("error output: " + text[-300:])
    for text in page.locator(f"{PANEL} .jp-OutputArea-output[data-mime-type='text/plain']").all_inner_texts():
        if WIDGET_TEXT_FALLBACK.match(text.strip()):
            found.append(f"widget shown as text, not rendered: {text.strip()[:80]}")
    for width in page.eval_on_selector_all(f"{PANEL} .jp-RenderedImage img", "imgs => imgs.map(i => i.naturalWidth)"):
        if not width:
            found.append("a figure did not render")
    return found


def responds(page, control: int, watched: str, timeout_ms: int = 10_000) -> bool:
    """Press → on slider number `control` of the first widget; does the `watched` element's text change?"""
    before = page.inner_text(watched)
    handle = page.locator(f"{PANEL} .jp-OutputArea-output .widget-slider .noUi-handle").nth(control)
    handle.focus()
    handle.press("ArrowRight")
    try:
        page.wait_for_function(f"document.querySelector({watched!r}).innerText !== {before!r}", timeout=timeout_ms)
        return True
    except Exception:
        return False
