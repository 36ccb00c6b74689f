"""Where the test suite's time goes: the slowest tests, each notebook's total, the whole run.

Registered by tests/conftest.py, so every `make test` ends with this report, and writes it to
artifacts/durations.json for a later lesson to compare against; then each test's one-line summary, given with
record_property("summary", line) (the replayed doctor corpus's precision and recall). nbval reports one item per
notebook cell; a notebook's time is the sum of its cells (the kernel's start is in the first). Under
pytest-xdist (`make test`) the two workers share the 2 cores, so a duration there is longer than the same test
alone (`make cost`), and the sums add up to more than the total.
"""
from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

SHOW = 10


class DurationReport:
    def __init__(self, root: Path, workers: int = 0):
        self.root = root
        self.workers = workers  # pytest-xdist workers; 0 without xdist
        self.start = time.monotonic()
        self.tests: dict[str, float] = defaultdict(float)  # test id -> setup + call + teardown
        self.notebooks: dict[str, float] = defaultdict(float)  # notebook path -> sum of its cells
        self.summaries: list[str] = []  # a test's one-line summary (record_property("summary", ...)), shown here

    def pytest_runtest_logreport(self, report):
        self.summaries += [value for name, value in report.user_properties if name == "summary"
                           and report.when == "call"]
        path = report.nodeid.split("::", 1)[0]
        if path.endswith(".ipynb"):
            self.notebooks[path] += report.duration
        else:
            self.tests[report.nodeid] += report.duration

    def pytest_terminal_summary(self, terminalreporter):
        total = time.monotonic() - self.start
        write = terminalreporter.write_line
        terminalreporter.section("where the time went")
        write(f"{'total':<70} {total:7.1f} s  (tests {sum(self.tests.values()):.0f} s, "
              f"notebooks {sum(self.notebooks.values()):.0f} s"
              + (f", side by side on {self.workers} workers)" if self.workers else ")"))
        for title, table in (("slowest tests", self.tests), ("notebooks under nbval", self.notebooks)):
            write(f"{title}:")
            for name, seconds in sorted(table.items(), key=lambda kv: -kv[1])[:SHOW]:
                write(f"  {name[:68]:<68} {seconds:7.1f} s")
        out = self.root / "artifacts" / "durations.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"total_s": round(total, 1),
                                   "notebooks_s": {k: round(v, 1) for k, v in sorted(self.notebooks.items())},
                                   "tests_s": {k: round(v, 1) for k, v in sorted(self.tests.items())}}, indent=1))
        write(f"(every duration: {out.relative_to(self.root)})")
        for line in self.summaries:
            write(line)
