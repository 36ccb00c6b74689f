import json
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


# What each scope took in a make test (tests/scope_seconds.json, rounded): the scheduler hands out the longest first,
# so that the run does not end on one worker with a long file the other could have shared. A new file is taken for
# UNKNOWN_SCOPE_S; the figures only order the work (refresh them from artifacts/durations.json when they drift).
SCOPE_SECONDS = ROOT / "tests" / "scope_seconds.json"
UNKNOWN_SCOPE_S = 10

# Under `pytest -n 2` the notebooks run as two groups, each in order on one worker. The second group uses no
# script of another lesson but ddp_common.py, which lesson 00 writes, so it starts once lesson 00's cell has written
# it (tests/test_notebook_sync.py checks that split against the scripts each notebook launches and imports).
SECOND_GROUP = ("10", "11", "12")  # 10_, 10b_, 11_...: lesson 11 launches 10's where_am_i.py; they stay together
WRITES_DDP_COMMON = "notebooks/00_start_here.ipynb"


def notebook_group(nodeid: str) -> str | None:
    """'notebooks' or 'notebooks, second group' for a notebook's cell; None for a test."""
    path = nodeid.split("::", 1)[0]
    if not path.endswith(".ipynb"):
        return None
    return "notebooks, second group" if Path(path).name.startswith(SECOND_GROUP) else "notebooks"


def cell_that_writes(notebook: str, script: str) -> str:
    """nbval's id of the %%writefile cell for ddp_scripts/<script>: 'Cell N' counts the code cells from 0."""
    cells = [c for c in json.loads((ROOT / notebook).read_text())["cells"] if c["cell_type"] == "code"]
    return next(f"{notebook}::Cell {n}" for n, c in enumerate(cells)
                if "".join(c["source"]).startswith(f"%%writefile ../ddp_scripts/{script}\n"))


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: without xdist, never called
def pytest_xdist_make_scheduler(config, log):
    """Each group of notebooks in order on one worker, as nbval needs; each test file whole, to whichever worker is
    free. The second group waits for the cell of lesson 00 that writes ddp_common.py (a file being rewritten is
    empty for a moment). With both cores busy the suite is bound by CPU: two groups pay because the one group's
    worker used to finish last."""
    from xdist.scheduler import LoadScopeScheduling
    ddp_common_written = cell_that_writes(WRITES_DDP_COMMON, "ddp_common.py")
    expected = json.loads(SCOPE_SECONDS.read_text())

    class NotebooksInTwoGroups(LoadScopeScheduling):
        second_group_may_start = False

        def _split_scope(self, nodeid):
            return notebook_group(nodeid) or nodeid.split("::", 1)[0]

        def _assign_work_unit(self, node):
            if ddp_common_written not in self.collection:  # lesson 00 is not in this run
                self.second_group_may_start = True
            allowed = [s for s in self.workqueue if s != "notebooks, second group" or self.second_group_may_start]
            if not allowed:  # only the second group is left, and lesson 00 has not written ddp_common.py yet
                return
            scope = max(allowed, key=lambda s: expected.get(s, UNKNOWN_SCOPE_S))  # the longest first
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

        def mark_test_complete(self, node, item_index, duration=0):
            written = self.registered_collections[node][item_index] == ddp_common_written
            self.second_group_may_start |= written
            super().mark_test_complete(node, item_index, duration)
            if written:  # a worker that waited for it (holding back its last item, as xdist does) may start now
                for other in self.nodes:
                    if other is not node:
                        self._reschedule(other)

    return NotebooksInTwoGroups(config, log)


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
