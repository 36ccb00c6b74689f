import time
import uuid
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "ddp_scripts"
FIXTURES = Path(__file__).resolve().parent / "scripts"
MARKER = "DDP_LESSONS_TEST_LAUNCH"


def pytest_configure(config):
    # Registered as a plugin, not as conftest hooks: it must see the notebooks' items too.
    from durations import DurationReport
    config.pluginmanager.register(DurationReport(ROOT), "duration-report")


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
