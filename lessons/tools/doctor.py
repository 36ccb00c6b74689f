"""The DDP doctor: run any script under torchrun with instruments in every rank, and report the classic mistakes.

    lessons.doctor("train.py", nproc=2, args=["--epochs", "2"])
    python -m lessons doctor train.py -n 2 -- --epochs 2
    python -m lessons doctor train.py -n 2 --compare -- --epochs 2     # N ranks == one process with their batch?
    python -m lessons doctor train.py -n 2 --profile -- --epochs 2     # where each rank's step time goes

The script is not changed: lessons/tools/doctor_site/sitecustomize.py is put first on the ranks' PYTHONPATH, and Python
loads it into each rank before the script. Each rank writes what it did to a file in a temporary directory; after
the launch the doctor compares the ranks and prints one line per finding, most serious first, each starting with a
stable code and the file:line where it shows.
Exit status (``report.status``, and the command's): 0 nothing found, 1 something found, 2 the script did not run to
the end (it crashed, hung, or can't be run; the findings that explain it are still listed). Notes (severity 4) leave
it 0. With --compare, a finding still makes it 1; without one it is the comparison's: 0 the same model, 1 not, 2 no
comparison was possible.
--profile watches speed, not correctness (lessons/tools/doctor_profile.py): it profiles a few optimizer steps of every
rank with torch.profiler and prints where their time goes, then a line per slowdown found. Exit status 3 a slowdown
found (the run is right but slow: not 1, which says the trained model is wrong), 0 none, 2 no profile.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from .doctor_compare import (COMPARE_RTOL, LOW_PRECISION, _compare, _compare_reasons,  # noqa: F401
                             _read_what_the_ranks_wrote)
from .doctor_launch import (PROFILE_SITE_DIR, SITE_DIR, SITE_FILE, _launch, _run, _spawn_error,  # noqa: F401
                            _torchrun_refused, _why_it_stopped)
from .doctor_record import Pass, Record, _shown_path, passes_of, read_record  # noqa: F401
from .doctor_report import CODES, NOTE, Code, DoctorReport, Finding  # noqa: F401
from .doctor_rules import RULES, STATIC, examine_record  # noqa: F401
from .doctor_static import _device_from_global_rank  # noqa: F401

RECORD_FILE = "launch.json"  # --record's: the launch beside the ranks' files (the script, the ranks, how it ended)


USAGE = ("python -m lessons doctor SCRIPT -n N [--timeout S] [--compare [--one-process-env NAME=VALUE]"
         " [--one-process-cwd DIR]] [--profile [--trace-dir DIR]] [--nodes K] [--record DIR] [-- ARGS]\n"
         "       python -m lessons doctor --replay DIR")


def doctor(script: str | os.PathLike, nproc: int = 2, args: tuple | list = (), timeout: float | None = 300,
           show: bool = False, env: dict[str, str] | None = None, compare: bool = False,
           nodes: int = 1, one_process_env: dict[str, str] | None = None,
           one_process_cwd: str | os.PathLike | None = None, profile: bool = False,
           trace_dir: str | os.PathLike | None = None, record_to: str | os.PathLike | None = None) -> DoctorReport:
    """Launch SCRIPT under torchrun with NPROC ranks (on each of NODES nodes), instrumented, and return the
    findings (print it to read it). compare=True also runs it as one process with the ranks' batch and compares
    the trained parameters; one_process_env and one_process_cwd give that run its own environment variables and
    working folder (a trainer that always resumes from a folder it is given). profile=True profiles the ranks
    instead, and reports slowdowns; trace_dir keeps their traces. record_to keeps what the ranks recorded, in a
    folder replay() decides from again."""
    if not Path(script).is_file():
        return DoctorReport(error=f"no such script: {script}")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= 4:
        return DoctorReport(error=f"nodes must be 1 to 4 (torchrun agents on this machine), got {nodes!r}")
    if compare and nodes > 1:
        return DoctorReport(error="--compare runs one node against one process: leave out --nodes")
    if (one_process_env or one_process_cwd) and not compare:
        return DoctorReport(error="--one-process-env and --one-process-cwd set up --compare's one process: add"
                                  " --compare")
    if profile and compare:
        return DoctorReport(error="--profile watches speed and --compare the trained model: run them one at a time")
    if trace_dir is not None and not profile:
        return DoctorReport(error="--trace-dir keeps --profile's traces: add --profile")
    if record_to is not None and profile:
        return DoctorReport(error="--record keeps the instruments' events, which --profile does not record")
    if profile:
        return _profile(script, nproc, args, timeout, show, env, nodes, trace_dir)
    if one_process_cwd is not None and not Path(one_process_cwd).is_dir():
        return DoctorReport(error=f"--one-process-cwd: no such folder: {one_process_cwd}")
    if not SITE_FILE.is_file():  # an install without the instruments would see nothing, and say so
        return DoctorReport(error=f"the doctor's instruments are missing from this install ({SITE_FILE}):"
                                  " reinstall the package (pip install --force-reinstall ddp-lessons)")
    if record_to is not None and Path(record_to).exists() and (not Path(record_to).is_dir() or any(
            Path(record_to).iterdir())):
        return DoctorReport(error=f"--record: {record_to} is not an empty folder")
    started = time.time()  # --compare: a file modified since was written by this run
    report, record = _run(script, nproc, args, timeout, show, env, nodes, {"LESSONS_DOCTOR_COMPARE": "1"}
                          if compare else {}, keep=record_to)
    _decide(report, record, script, nproc * nodes)
    if record_to is not None and record is not None:
        (Path(record_to) / RECORD_FILE).write_text(json.dumps({
            "script": str(script), "ranks": nproc * nodes, "error": report.error,
            "failed_rank": getattr(report, "failed_rank", None),
            "read": [vars(f) for f in (STATIC.decide(script) if nproc * nodes > 1 else [])]}, indent=1) + "\n")
    if compare:
        alone = {"env": {**(env or {}), **(one_process_env or {})}, "cwd": one_process_cwd}
        report.compare, report.compare_status = _compare(script, nproc, args, timeout, alone, report, record,
                                                         started)
    return report


def _decide(report: DoctorReport, record: Record | None, script, ranks: int, read: list | None = None) -> None:
    """The findings and notes of a run from what its RANKS recorded and the script's text (READ: what the text
    gave when the run was recorded, for a script no longer there), into REPORT."""
    report.record = record
    if record is None:
        return
    failed = getattr(report, "failed_rank", None)
    found = examine_record(record, ranks, crashed=report.error is not None,
                           failed=set() if failed is None else {failed})
    if ranks > 1:
        found += STATIC.decide(script) if Path(script).is_file() else [Finding(**f) for f in read or []]
    report.findings = [f for f in found if CODES[f.code].severity < NOTE]
    report.notes = [f for f in found if CODES[f.code].severity == NOTE]


def replay(folder: str | os.PathLike) -> DoctorReport:
    """Decide again, without a launch, from what a run's ranks recorded (doctor(..., record_to=FOLDER), or the
    command's --record FOLDER): the rules as they are now, on the events as they were. The script's text is read
    where it was, when it is still there; the sites name files from the folder the run was launched in."""
    folder = Path(folder)
    try:
        launch = json.loads((folder / RECORD_FILE).read_text())
    except (OSError, ValueError) as error:
        return DoctorReport(error=f"--replay: {folder} holds no run the doctor recorded ({RECORD_FILE}: {error})")
    report = DoctorReport(error=launch["error"])
    report.failed_rank = launch["failed_rank"]
    _decide(report, read_record(folder, launch["ranks"]), launch["script"], launch["ranks"], launch.get("read"))
    return report


def _profile(script, nproc, args, timeout, show, env, nodes, trace_dir) -> DoctorReport:
    """--profile: one launch with the profiler's instruments only; the breakdown and the slowdowns."""
    import shutil

    from .doctor_profile import judge, read_profile

    if trace_dir is not None and Path(trace_dir).exists() and not Path(trace_dir).is_dir():
        return DoctorReport(error=f"--trace-dir: {trace_dir} is a file, not a folder")
    with tempfile.TemporaryDirectory(prefix="ddp_doctor_") as out_dir:
        report, ran = _launch(script, nproc, args, timeout, show, env, nodes, {}, None, out_dir, PROFILE_SITE_DIR)
        if not ran:
            return report
        ranks, metas, lines, why = read_profile(out_dir, nproc * nodes)
        if trace_dir is not None and not why:
            Path(trace_dir).mkdir(parents=True, exist_ok=True)
            for rank in range(nproc * nodes):
                shutil.copy(Path(out_dir) / f"rank{rank}.json", Path(trace_dir) / f"rank{rank}.json")
            lines.append(f"profile: one Chrome trace a rank in {trace_dir} (open it in https://ui.perfetto.dev)")
    if why and report.error is None:
        report.no_profile = why
    if not why:
        report.slowdowns, unsure = judge(ranks, metas)
        report.profile = lines + unsure
    return report


def examine(out_dir: Path, nproc: int, crashed: bool = False) -> list[Finding]:
    """The findings in what NPROC ranks wrote to OUT_DIR, most serious first."""
    return examine_record(read_record(Path(out_dir), nproc), nproc, crashed)


# --- The command line -------------------------------------------------------------------------------------------

def main(argv: list[str]) -> int:
    """The command line: USAGE."""
    import argparse
    import sys

    own, script_args = argv, []
    if "--" in argv:
        cut = argv.index("--")
        own, script_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(
        prog="python -m lessons doctor", usage=USAGE,
        description="Run SCRIPT under torchrun with the DDP doctor's instruments, and report the classic DDP"
                    " mistakes it made, each with its file:line. Exit status: 0 nothing found (notes aside), 1"
                    " something found, 2 the script did not run to the end; with --compare and no finding, 0 the"
                    " same model, 1 not, 2 no comparison; with --profile, 3 a slowdown found, 0 none, 2 no"
                    " profile.",
        epilog="The script's own arguments go after --, e.g. python -m lessons doctor train.py -n 2 -- --epochs 2")
    parser.add_argument("script", nargs="?", help="the training script, as you would give it to torchrun")
    parser.add_argument("-n", "--nproc", type=int, default=2, help="ranks (per node), default 2")
    parser.add_argument("--timeout", type=float, default=300, help="seconds for the launch; 0 for none")
    parser.add_argument("--compare", action="store_true",
                        help="also run it as one process with the ranks' batch, and compare the trained parameters")
    parser.add_argument("--nodes", type=int, default=1, help="torchrun agents on this machine, as K nodes would")
    parser.add_argument("--one-process-env", action="append", default=[], metavar="NAME=VALUE",
                        help="--compare: an environment variable for the one process only (a trainer that resumes"
                             " from a folder named in the environment); repeat it for several")
    parser.add_argument("--profile", action="store_true",
                        help="profile a few optimizer steps of every rank: where the time goes, and the slowdowns"
                             " (exit status 3 when one is found)")
    parser.add_argument("--trace-dir", metavar="DIR", help="--profile: keep each rank's Chrome trace here")
    parser.add_argument("--one-process-cwd", metavar="DIR",
                        help="--compare: the one process's working folder (relative paths of its own)")
    parser.add_argument("--record", metavar="DIR", help="keep what the ranks recorded in DIR (a new folder), for"
                                                             " --replay")
    parser.add_argument("--replay", metavar="DIR", help="decide again from a run kept with --record, without a"
                                                         " launch")
    options, unknown = parser.parse_known_args(own)
    if options.replay:
        if options.script or script_args:
            print("doctor: --replay DIR decides from the recorded run alone: leave out the script and its arguments",
                  file=sys.stderr)
            return 2
        report = replay(options.replay)
        print(report)
        return report.status
    if not options.script:
        print(f"doctor: give the script to run: {USAGE}", file=sys.stderr)
        return 2
    if unknown:
        print(f"doctor: {' '.join(unknown)} is not the doctor's: the script's own arguments go after --, as in"
              f" python -m lessons doctor {options.script} -n {options.nproc} -- {' '.join(unknown)}",
              file=sys.stderr)
        return 2
    malformed = [item for item in options.one_process_env if "=" not in item or item.startswith("=")]
    if malformed:
        print(f"doctor: --one-process-env {malformed[0]}: give NAME=VALUE", file=sys.stderr)
        return 2
    report = doctor(options.script, nproc=options.nproc, args=script_args, timeout=options.timeout or None,
                    compare=options.compare, nodes=options.nodes,
                    one_process_env=dict(item.split("=", 1) for item in options.one_process_env),
                    one_process_cwd=options.one_process_cwd, profile=options.profile,
                    trace_dir=options.trace_dir, record_to=options.record)
    print(report)
    return report.status


def console() -> int:
    """The ddp-doctor command (pyproject.toml's [project.scripts])."""
    import sys
    return main(sys.argv[1:])
