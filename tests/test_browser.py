"""The JupyterLab walkthrough in a real browser: every notebook opened and looked at; the widgets run and are
moved; one launch run through Run All and watched while it runs (its live output).

nbval runs kernels, not the browser: only this shows that outputs render, that widgets respond, and that a
launch's lines appear while it runs (nbval sees only a cell's final output).
nbval already executes every cell of every notebook, so the browser runs only what nbval cannot check.
Screenshots land in artifacts/screenshots/.
"""
import importlib.util
import json
import os
import shutil
import time
from pathlib import Path

import nbformat
import pytest

from browser import (CHROMIUM, PANEL, chromium, close_all, jupyterlab, open_in_lab, open_lab, problems_on_page,
                     responds, run_cells, run_notebook, start_run_all)
from conftest import FIXTURES, ROOT, SCRIPTS

NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
# The one list of notebooks whose widgets run in the browser (nbval cannot press a slider):
# slider to press -> element whose text must change. Their widget cells run here, after the first cell (the
# imports), as a learner who jumps to the widget would run them; nbval executes every cell, launches included.
RUN_IN_BROWSER = {
    "02b_ring_allreduce_from_scratch.ipynb": (1, ".ring-step"),  # the step slider of the ring stepper
    "05_distributed_sampler.ipynb": (0, ".sampler-shards"),  # the dataset-size slider of the explorer
}
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def committed_outputs(notebook: str, mime: str) -> int:
    cells = json.loads((ROOT / "notebooks" / notebook).read_text())["cells"]
    return sum(mime in out.get("data", {}) for c in cells if c["cell_type"] == "code" for out in c["outputs"])


def test_every_notebook_with_a_widget_runs_in_the_browser():
    with_widgets = {nb for nb in NOTEBOOKS if committed_outputs(nb, WIDGET_MIME)}
    assert with_widgets - set(RUN_IN_BROWSER) == set(), "add these to RUN_IN_BROWSER: only a browser moves a slider"
    assert set(RUN_IN_BROWSER) <= set(NOTEBOOKS)


@pytest.fixture(scope="module")
def browser():
    missing = [what for what, ok in (("/usr/bin/chromium", Path(CHROMIUM).exists()),
                                     ("playwright", importlib.util.find_spec("playwright") is not None)) if not ok]
    if missing:
        message = f"browser test: {' and '.join(missing)} missing (make test installs them where apt-get works)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI can install them: a skip there would hide a broken set-up
        pytest.skip(message)
    with chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def course_copy(tmp_path_factory):
    """A copy of the course, so that running it cannot rewrite committed files."""
    root = tmp_path_factory.mktemp("course")
    shutil.copytree(ROOT / "notebooks", root / "notebooks")
    shutil.copytree(SCRIPTS, root / "ddp_scripts", ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture(scope="module")
def course_lab(course_copy):
    """JupyterLab on the copy of the course."""
    with jupyterlab(course_copy) as lab:
        yield lab


@pytest.fixture(scope="module")
def lab_page(browser, course_lab):
    """One JupyterLab page for every notebook, each opened in turn and closed: the lab loads once (about 2.7 CPU-s
    a load), not once per notebook."""
    url, token = course_lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    open_lab(page, url, token)
    yield page
    page.close()


@pytest.mark.parametrize("notebook", sorted(set(NOTEBOOKS) - set(RUN_IN_BROWSER)))  # saved widgets show as text
def test_committed_outputs_render_in_jupyterlab(notebook, lab_page):
    open_in_lab(lab_page, f"notebooks/{notebook}")
    try:
        figures = committed_outputs(notebook, "image/png")
        lab_page.wait_for_function(f"[...document.querySelectorAll('{PANEL} .jp-RenderedImage img')]"
                                   f".filter(i => i.complete).length >= {figures}", timeout=30_000)
        assert problems_on_page(lab_page) == []
    finally:
        screenshot(lab_page, notebook)
        close_all(lab_page)


def widget_cells(notebook: str) -> list[int]:
    """The first code cell (the imports) and every cell whose committed output is a widget, by index among all cells."""
    cells = json.loads((ROOT / "notebooks" / notebook).read_text())["cells"]
    code = [i for i, c in enumerate(cells) if c["cell_type"] == "code"]
    return [code[0]] + [i for i in code[1:] if any(WIDGET_MIME in out.get("data", {}) for out in cells[i]["outputs"])]


@pytest.mark.parametrize("notebook", sorted(RUN_IN_BROWSER))
def test_widgets_run_in_jupyterlab_and_respond(notebook, lab_page):
    page = lab_page
    try:
        cells = widget_cells(notebook)
        assert len(cells) > 1, "no cell with a widget"
        run_cells(page, f"notebooks/{notebook}", cells)
        figures = committed_outputs(notebook, "image/png")  # the committed ones, in the cells that did not run
        page.wait_for_function(f"[...document.querySelectorAll('{PANEL} .jp-RenderedImage img')]"
                               f".filter(i => i.complete).length >= {figures}", timeout=30_000)
        assert page.locator(f"{PANEL} .jp-RenderedImage img").count() == figures, "figures differ from the committed"
        assert problems_on_page(page) == []
        assert page.locator(f"{PANEL} .jp-OutputArea-output .jupyter-widgets").count() > 0, "no widget rendered"
        control, watched = RUN_IN_BROWSER[notebook]
        assert responds(page, control, watched), f"{watched} did not change when its slider moved"
    finally:
        screenshot(page, notebook)
        close_all(page, discard=True)


def screenshot(page, notebook):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{Path(notebook).stem}.png"))


def cell(source):
    return {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": source}


def test_a_broken_widget_fails_these_checks(lab_page, course_copy):
    """The checks can fail: a widget that is not wired up, one shown as text, and an error."""
    broken = {"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}, "cells": [
        cell("import ipywidgets as w\nw.VBox([w.IntSlider(), w.HTML(\"<div class='ring-step'>step 0</div>\")])"),
        cell("from IPython.display import display\ndisplay({'text/plain': repr(w.IntSlider())}, raw=True)"),
        cell("1 / 0"),
    ]}
    (course_copy / "notebooks" / "broken.ipynb").write_text(json.dumps(broken))
    page = lab_page
    try:
        run_notebook(page, "notebooks/broken.ipynb", timeout_s=120)
        assert not responds(page, 0, ".ring-step", timeout_ms=3_000)  # the real ones change within 10 s
        problems = problems_on_page(page)
        assert any(p.startswith("widget shown as text, not rendered: IntSlider(") for p in problems), problems
        assert any(p.startswith("error output:") and "ZeroDivisionError" in p for p in problems), problems
    finally:
        screenshot(page, "broken_control")
        close_all(page, discard=True)


def test_a_launch_shows_the_ranks_lines_while_it_runs(lab_page, course_copy):
    """Lesson 11's live output, as a learner sees it: each rank's first line appears while the cell still runs
    (prompt [*]); when the launch ends, the cell holds the usual rank-by-rank output, each line once."""
    shutil.copy(FIXTURES / "print_then_wait.py", course_copy / "print_then_wait.py")  # a line, then works until:
    seen_both = course_copy / "seen_both_lines"  # this file exists
    cell = nbformat.v4.new_code_cell('import lessons\nrun = lessons.torchrun("../print_then_wait.py", nproc=2, '
                                     f'timeout=60, args=[{str(seen_both)!r}])')
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nbformat.write(nbformat.v4.new_notebook(cells=[cell], metadata=kernel), course_copy / "notebooks" / "live_output.ipynb")
    page = lab_page
    cell_state = """() => {
        const cell = document.querySelector('PANEL .jp-CodeCell');
        return [cell.querySelector('.jp-InputPrompt').innerText, cell.querySelector('.jp-OutputArea').innerText];
    }""".replace("PANEL", PANEL)
    try:
        start_run_all(page, "notebooks/live_output.ipynb")
        deadline, seen = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            prompt, text = page.evaluate(cell_state)
            if "tick from rank 0" in text and "tick from rank 1" in text:
                seen = prompt
                break
            time.sleep(0.2)
        seen_both.touch()  # the ranks may end now
        assert seen is not None, "the ranks' lines never appeared"
        assert "*" in seen, f"the lines appeared only when the launch had ended (prompt {seen})"
        page.wait_for_function(f"({cell_state})()[0].includes('[1]')", timeout=60_000, polling=500)
        prompt, text = page.evaluate(cell_state)
        assert text.count("tick from rank 0") == 1 and "[rank0] done" in text, text  # the live lines, replaced
        assert problems_on_page(page) == []
    finally:
        screenshot(page, "live_output.ipynb")
        close_all(page, discard=True)
