"""The doctor's corpus, replayed: every rule decided again from each case's recorded run, in seconds, no launch.

tests/doctor_corpus/<case>/ holds what the ranks of one run of benchmarks/doctor_corpus.py recorded (their events,
their parameters, launch.json: the script, the ranks, how the launch ended) and the case's labels (case.json: the
codes a reader expects, notes included; the exit status where it is part of the case). A rule that loses a case, or
raises a code no label has, fails here, in make test, not in a benchmark nobody ran. The launches themselves (the
instruments, --compare's one process) are the benchmark's: re-record with
`.venv/bin/python benchmarks/doctor_corpus.py --record-to tests/doctor_corpus` when the instruments change.
"""
import json
from pathlib import Path

import pytest

from lessons.tools.doctor import replay

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "doctor_corpus"
CASES = sorted(path.parent for path in CORPUS.glob("*/case.json"))


def decided(case: Path):
    """(the labels, the codes the rules decide now, the exit status without --compare's verdict)."""
    labels = json.loads((case / "case.json").read_text())
    report = replay(case)
    return labels, sorted({f.code for f in report.findings + report.notes}), report


@pytest.fixture(scope="module")
def replayed():
    import os
    here = os.getcwd()
    os.chdir(ROOT)  # the sites name files from where the corpus ran: the script's `if`s are read there
    try:
        return {case.name: decided(case) for case in CASES}
    finally:
        os.chdir(here)


def test_the_corpus_is_recorded():
    assert len(CASES) >= 70, f"{len(CASES)} recorded cases in {CORPUS}: re-record them (this file's docstring)"


def test_every_rule_is_right_on_every_recorded_case(replayed, record_property):
    """Precision and recall over every code of every case, printed; every case right."""
    true, false, missed, wrong = 0, 0, 0, []
    for name, (labels, found, report) in sorted(replayed.items()):
        wanted = set(labels["codes"])
        true, false, missed = true + len(wanted & set(found)), false + len(set(found) - wanted), \
            missed + len(wanted - set(found))
        status = labels.get("status")
        problems = [f"raised {code}" for code in sorted(set(found) - wanted)]
        problems += [f"missed {code}" for code in sorted(wanted - set(found))]
        if status is not None and not labels.get("compare") and report.status != status:
            problems.append(f"exit status {report.status}, not {status}")
        if labels.get("error") and labels["error"] not in str(report):
            problems.append(f"does not say {labels['error']!r}")
        if problems:
            wrong.append(f"{labels['title']}: {'; '.join(problems)}")
    precision = true / (true + false) if true + false else 1.0
    recall = true / (true + missed) if true + missed else 1.0
    record_property("summary", f"doctor corpus replayed: {len(replayed)} cases, {true} true findings, {false} false"
                               f" alarms, {missed} missed: precision {precision:.3f}, recall {recall:.3f}")
    assert not wrong, "\n".join(wrong)


def test_a_replay_says_what_it_could_not_read(tmp_path):
    report = replay(tmp_path)
    assert report.status == 2 and str(report).startswith("the script did not run to the end: --replay:"), str(report)
