"""The DDP doctor's rules: what the ranks recorded (lessons/tools/doctor_events.py) turned into findings.

The doctor is split by area, as the instruments are: the report (doctor_report.py: CODES, a finding, a rule, the exit
status), the record (doctor_record.py: the events read back, and the facts the rules share, built once), the group
and the model (doctor_group.py), data (doctor_data.py), files (doctor_files.py), the static reading
(doctor_static.py) and --compare (doctor_compare.py); the launch and the command line are doctor.py. Each area
registers its rules with the codes they decide and the events they read; RULES, here, is all of them. CODES' order is
the order findings are printed in (by severity first). A new finding: CONTRIBUTING.md, "A new finding of the doctor".
"""

from __future__ import annotations

from . import doctor_data, doctor_files, doctor_group
from .doctor_record import Facts, Record
from .doctor_report import CODES, Finding
from .doctor_static import STATIC  # noqa: F401  (the rule that reads the script, asked by doctor.py)


RULES = doctor_group.RULES + doctor_data.RULES + doctor_files.RULES  # in any order: the findings are
# sorted by CODES


def examine_record(record: Record, nproc: int, crashed: bool = False, failed: set[int] = frozenset()) -> list[Finding]:
    """The findings in what NPROC ranks recorded, most serious first; crashed: the launch failed (FAILED: the ranks
    whose own error it was, when known)."""
    facts = Facts(record, nproc, crashed, set(failed))
    found = []
    for rule in RULES:
        decided = rule.decide(facts)
        if decided and rule.alone:
            return decided
        found += decided
    order = list(CODES)
    return sorted(found, key=lambda f: (CODES[f.code].severity, order.index(f.code)))
