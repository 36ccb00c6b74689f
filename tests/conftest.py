import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "scripts"
MARKER = "DDP_LESSONS_TEST_LAUNCH"
# `make test` runs the notebooks and the tests on two pytest-xdist workers. The notebooks' %%writefile
# cells rewrite ddp_scripts/ meanwhile (the same text, but a file being rewritten is empty for a moment), so the
# tests launch a snapshot of ddp_scripts/ that the controller takes before any worker starts.
SNAPSHOT = "DDP_LESSONS_SCRIPTS_SNAPSHOT"
SCRIPTS = Path(os.environ[SNAPSHOT]) if SNAPSHOT in os.environ else ROOT / "ddp_scripts"


def pytest_configure(config):
    if hasattr(config, "workerinput"):  # an xdist worker: the controller reports, and took the snapshot
        return
    # Registered as a plugin, not as conftest hooks: it must see the notebooks' items too.
    from durations import DurationReport
    workers = config.getoption("numprocesses", None) or 0  # None without xdist installed
    config.pluginmanager.register(DurationReport(ROOT, workers), "duration-report")
    if workers:
        snapshot = Path(tempfile.mkdtemp(prefix="ddp_lessons_scripts_")) / "ddp_scripts"
        shutil.copytree(ROOT / "ddp_scripts", snapshot, ignore=shutil.ignore_patterns("__pycache__"))
        os.environ[SNAPSHOT] = str(snapshot)  # the workers inherit it


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput") and SNAPSHOT in os.environ:
        shutil.rmtree(Path(os.environ.pop(SNAPSHOT)).parent, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: without xdist, never called
def pytest_xdist_make_scheduler(config, log):
    """Under `pytest -n 2`: every notebook on one worker, in order, as without xdist (they share ddp_scripts/, and
    lesson 11 checks that nothing runs its scripts); each test file goes whole to whichever worker is free.

    Measured once here, two groups of notebooks side by side were no faster (742.6 s against 740.9 s): with both
    cores busy the suite is bound by CPU. But the notebooks' worker finishes last (in a fresh run the other idled
    its last 170 s), so splitting them may pay as the course grows: lesson 11 must stay with lesson 10, and lessons
    04-09 with 04, which writes the train_ddp.py they use."""
    from xdist.scheduler import LoadScopeScheduling

    class NotebooksTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            path = nodeid.split("::", 1)[0]
            return "notebooks" if path.endswith(".ipynb") else path

    return NotebooksTogether(config, log)


def processes_with(marker: str) -> list[str]:
    """Every process whose environment carries this test's marker (orphans inherit it too)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.environ().get(MARKER) == marker:
                found.append(f"{p.pid}: {' '.join(p.info['cmdline'] or [])}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


@pytest.fixture
def launch_env():
    """Environment to pass to lessons.torchrun; the test fails if any process of it outlives the test."""
    marker = uuid.uuid4().hex
    yield {MARKER: marker}
    deadline = time.monotonic() + 2  # a process that has just been killed may take a moment to go
    while (left := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], f"processes left behind by the launch: {left}"
