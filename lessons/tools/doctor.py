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

import os
import re
import tempfile
import time
from pathlib import Path

from .doctor_compare import (COMPARE_RTOL, LOW_PRECISION, _compare, _compare_reasons,  # noqa: F401
                             _read_what_the_ranks_wrote)
from .doctor_record import Pass, Record, _shown_path, passes_of, read_record  # noqa: F401
from .doctor_report import CODES, NOTE, Code, DoctorReport, Finding  # noqa: F401
from .doctor_rules import RULES, STATIC, examine_record  # noqa: F401
from .doctor_static import _device_from_global_rank  # noqa: F401
from .launch import LaunchError, LaunchResult, torchrun

SITE_DIR = Path(__file__).resolve().parent / "doctor_site"
SITE_FILE = SITE_DIR / "sitecustomize.py"  # the instruments: loaded into every rank by Python itself
PROFILE_SITE_DIR = Path(__file__).resolve().parent / "doctor_profile_site"  # --profile's: the profiler, nothing else


USAGE = ("python -m lessons doctor SCRIPT -n N [--timeout S] [--compare [--one-process-env NAME=VALUE]"
         " [--one-process-cwd DIR]] [--profile [--trace-dir DIR]] [--nodes K] [-- ARGS]")


def doctor(script: str | os.PathLike, nproc: int = 2, args: tuple | list = (), timeout: float | None = 300,
           show: bool = False, env: dict[str, str] | None = None, compare: bool = False,
           nodes: int = 1, one_process_env: dict[str, str] | None = None,
           one_process_cwd: str | os.PathLike | None = None, profile: bool = False,
           trace_dir: str | os.PathLike | None = None) -> DoctorReport:
    """Launch SCRIPT under torchrun with NPROC ranks (on each of NODES nodes), instrumented, and return the
    findings (print it to read it). compare=True also runs it as one process with the ranks' batch and compares
    the trained parameters; one_process_env and one_process_cwd give that run its own environment variables and
    working folder (a trainer that always resumes from a folder it is given). profile=True profiles the ranks
    instead, and reports slowdowns; trace_dir keeps their traces."""
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
    if profile:
        return _profile(script, nproc, args, timeout, show, env, nodes, trace_dir)
    if one_process_cwd is not None and not Path(one_process_cwd).is_dir():
        return DoctorReport(error=f"--one-process-cwd: no such folder: {one_process_cwd}")
    if not SITE_FILE.is_file():  # an install without the instruments would see nothing, and say so
        return DoctorReport(error=f"the doctor's instruments are missing from this install ({SITE_FILE}):"
                                  " reinstall the package (pip install --force-reinstall ddp-lessons)")
    started = time.time()  # --compare: a file modified since was written by this run
    report, record = _run(script, nproc, args, timeout, show, env, nodes, {"LESSONS_DOCTOR_COMPARE": "1"}
                          if compare else {})
    report.record = record
    if record is not None:
        failed = getattr(report, "failed_rank", None)
        found = examine_record(record, nproc * nodes, crashed=report.error is not None,
                               failed=set() if failed is None else {failed})
        found += STATIC.decide(script) if nproc * nodes > 1 else []
        report.findings = [f for f in found if CODES[f.code].severity < NOTE]
        report.notes = [f for f in found if CODES[f.code].severity == NOTE]
    if compare:
        alone = {"env": {**(env or {}), **(one_process_env or {})}, "cwd": one_process_cwd}
        report.compare, report.compare_status = _compare(script, nproc, args, timeout, alone, report, record,
                                                         started)
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


def _launch(script, nproc, args, timeout, show, env, nodes, extra_env, cwd, out_dir,
            site_dir) -> tuple[DoctorReport, bool]:
    """Launch SCRIPT under torchrun with SITE_DIR's instruments writing to OUT_DIR: the report's launch and error, and
    whether the ranks ran at all (False: bad arguments, or torchrun refused its own)."""
    from .nodes import torchrun_nodes  # lessons.tools.nodes imports lessons.tools.launch: imported when needed

    python_path = os.pathsep.join(p for p in (str(site_dir), (env or {}).get("PYTHONPATH",
                                              os.environ.get("PYTHONPATH", ""))) if p)
    # The user's OMP_NUM_THREADS, as torchrun would keep it (lessons.torchrun sets 1 otherwise): the run as it is
    threads = {"OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]} if os.environ.get("OMP_NUM_THREADS") else {}
    launch_env = {**threads, **(env or {}), **extra_env, "PYTHONPATH": python_path, "LESSONS_DOCTOR_DIR": out_dir}
    launch_env.pop("LESSONS_DOCTOR_RANK_PID", None)
    report = DoctorReport()
    try:
        if nodes > 1:
            launched = torchrun_nodes(script, nnodes=nodes, nproc_per_node=nproc, args=list(args),
                                      timeout=timeout, show=show, env=launch_env)
            report.launch = launched.nodes[0]
        else:
            report.launch = torchrun(Path(script).resolve() if cwd else script, nproc=nproc,
                                     args=[str(a) for a in args], timeout=timeout, show=show, env=launch_env,
                                     live=False, cwd=cwd)
    except LaunchError as error:
        report.launch = error.result
        report.error = _why_it_stopped(error)
        report.failed_rank = error.rank
    except (ValueError, TypeError, FileNotFoundError) as error:  # bad arguments (nproc, timeout): one line
        return DoctorReport(error=str(error)), False
    refused = _torchrun_refused(report.launch)
    if refused:  # torchrun's own argument error: no rank started
        return DoctorReport(launch=report.launch, error=refused), False
    return report, True


def _run(script, nproc, args, timeout, show, env, nodes, extra_env, cwd=None) -> tuple[DoctorReport, Record | None]:
    """One instrumented launch; the report's error, and what the ranks recorded."""
    with tempfile.TemporaryDirectory(prefix="ddp_doctor_") as out_dir:
        report, ran = _launch(script, nproc, args, timeout, show, env, nodes, extra_env, cwd, out_dir, SITE_DIR)
        if not ran:
            return report, None
        record = read_record(Path(out_dir), nproc * nodes)
    unseen = [rank for rank, events in record.events.items() if not any(e["event"] == "start" for e in events)]
    if unseen:  # never "no findings" about a rank it did not see
        return DoctorReport(launch=report.launch, error=report.error or (
            f"the doctor did not see rank {unseen[0]}: its instruments did not load there ({SITE_FILE.name} from"
            f" {SITE_DIR} first on PYTHONPATH; python -E or -I ignores it), so it can't say what the run did")), None
    if record.errors:  # the instruments failed in a rank: what it recorded is not the whole story
        rank, why = min(record.errors.items())
        report.error = f"the doctor's instruments failed in rank {rank} (please report it): {why}"
    spawned = [e for evs in record.events.values() for e in evs if e["event"] == "spawn"]
    if spawned:
        report.error = _spawn_error(f"{spawned[0]['site']}: {spawned[0]['call']}")
    return report, record


def _torchrun_refused(launch: LaunchResult | None) -> str | None:
    """torchrun's own argparse error ("torchrun: error: ambiguous option: --log could match ..."), with what to do:
    a script's flag that is a prefix of torchrun's options is taken as torchrun's."""
    text = getattr(launch, "launcher_log", "") or ""
    line = next((l for l in text.splitlines() if re.match(r"\S+: error: ", l)), None)
    if line is None:
        return None
    hint = (": the script's flag is taken for torchrun's own (torchrun reads every option before the script's"
            " name that is a prefix of one of its own, and refuses an ambiguous one); spell the flag out in full,"
            " or give it as --flag=value") if "ambiguous option" in line else ""
    return f"torchrun refused its arguments: {line.split(': error: ', 1)[1]}{hint}"


def _spawn_error(where: str) -> str:
    place, call = where.rsplit(": ", 1)
    return (f"{place}: the script starts its own ranks ({call}), and torchrun has already started them: run it with"
            " python, or drop the spawn and read RANK, LOCAL_RANK and WORLD_SIZE from the environment (lesson 10)")


def _why_it_stopped(error: LaunchError) -> str:
    """One line for a crash (the failing rank's own file:line and error), the places of each rank for a hang."""
    message = str(error)
    if error.result is not None and error.result.stacks:  # a hang: where each rank was
        return re.sub(r" The full stacks are in \.result\.stacks, the output so far in \.result\.outputs\.", "",
                      message)
    if error.rank is not None and error.result is not None:
        stderr = error.result.stderr.get(error.rank, "")
        frames = re.findall(r'File "([^"]+)", line (\d+)', stderr)
        own = [(f, n) for f, n in frames if "site-packages" not in f and "/torch/" not in f
               and SITE_DIR.name not in f and PROFILE_SITE_DIR.name not in f and not f.startswith("<")]
        where = own[-1] if own else frames[-1] if frames else None
        if where:
            return (f"rank {error.rank} failed at {_shown_path(where[0])}:{where[1]}:"
                    f" {error.root_cause or message.splitlines()[0]}")
    return error.root_cause or message.splitlines()[0]


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
    parser.add_argument("script", help="the training script, as you would give it to torchrun")
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
    options, unknown = parser.parse_known_args(own)
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
                    trace_dir=options.trace_dir)
    print(report)
    return report.status


def console() -> int:
    """The ddp-doctor command (pyproject.toml's [project.scripts])."""
    import sys
    return main(sys.argv[1:])
