"""The JupyterLab walkthrough in a real browser: every notebook cleared, run, and looked at.

nbval runs kernels, not the browser: only this shows that widgets render and respond.
Screenshots land in artifacts/screenshots/.
"""
import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

from browser import CHROMIUM, PANEL, chromium, jupyterlab, problems_on_page, responds, run_notebook
from conftest import ROOT

NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
# notebook -> (slider to press, element whose text must change)
INTERACTIONS = {
    "02_collectives_and_ring_allreduce.ipynb": (1, ".ring-step"),  # the step slider of the ring stepper
    "05_distributed_sampler.ipynb": (0, ".sampler-shards"),  # the dataset-size slider of the explorer
}
WITH_FIGURES = {"02_collectives_and_ring_allreduce.ipynb", "03_ddp_from_scratch.ipynb", "04_ddp_training.ipynb",
                "06_data_loading.ipynb"}


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
def course_lab(tmp_path_factory):
    """JupyterLab on a copy of the course, so that running it cannot rewrite committed files."""
    root = tmp_path_factory.mktemp("course")
    shutil.copytree(ROOT / "notebooks", root / "notebooks")
    shutil.copytree(ROOT / "ddp_scripts", root / "ddp_scripts", ignore=shutil.ignore_patterns("__pycache__"))
    with jupyterlab(root) as lab:
        yield lab


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_notebook_runs_in_jupyterlab(notebook, browser, course_lab):
    url, token = course_lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        run_notebook(page, url, token, f"notebooks/{notebook}")
        assert problems_on_page(page) == []
        if notebook in WITH_FIGURES:
            assert page.locator(f"{PANEL} .jp-RenderedImage img").count() > 0, "no figure rendered"
        if notebook in INTERACTIONS:
            assert page.locator(f"{PANEL} .jp-OutputArea-output .jupyter-widgets").count() > 0, "no widget rendered"
            control, watched = INTERACTIONS[notebook]
            assert responds(page, control, watched), f"{watched} did not change when its slider moved"
    finally:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{Path(notebook).stem}.png"))
        page.close()


def cell(source):
    return {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": source}


def test_a_broken_widget_fails_these_checks(browser, tmp_path):
    """The checks can fail: a widget that is not wired up, one shown as text, and an error."""
    broken = {"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}, "cells": [
        cell("import ipywidgets as w\nw.VBox([w.IntSlider(), w.HTML(\"<div class='ring-step'>step 0</div>\")])"),
        cell("from IPython.display import display\ndisplay({'text/plain': repr(w.IntSlider())}, raw=True)"),
        cell("1 / 0"),
    ]}
    (tmp_path / "broken.ipynb").write_text(json.dumps(broken))
    with jupyterlab(tmp_path) as (url, token):
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            run_notebook(page, url, token, "broken.ipynb", timeout_s=120)
            assert not responds(page, 0, ".ring-step")
            problems = problems_on_page(page)
            assert any(p.startswith("widget shown as text, not rendered: IntSlider(") for p in problems), problems
            assert any(p.startswith("error output:") and "ZeroDivisionError" in p for p in problems), problems
        finally:
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "broken_control.png"))
            page.close()
