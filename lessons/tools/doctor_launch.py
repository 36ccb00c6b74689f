"""The DDP doctor's launch: the script under torchrun with the instruments first on the ranks' PYTHONPATH, what the
ranks recorded read back, and why a launch stopped, in one line. doctor.py (the findings, the command line) and
doctor_compare.py (--compare's one process) both launch through here."""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from .doctor_record import Record, _shown_path, read_record
from .doctor_report import DoctorReport
from .launch import LaunchError, LaunchResult, torchrun

SITE_DIR = Path(__file__).resolve().parent / "doctor_site"
SITE_FILE = SITE_DIR / "sitecustomize.py"  # the instruments: loaded into every rank by Python itself
PROFILE_SITE_DIR = Path(__file__).resolve().parent / "doctor_profile_site"  # --profile's: the profiler, nothing else


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


def _run(script, nproc, args, timeout, show, env, nodes, extra_env, cwd=None,
         keep=None) -> tuple[DoctorReport, Record | None]:
    """One instrumented launch; the report's error, and what the ranks recorded (copied to KEEP, a folder)."""
    import shutil

    with tempfile.TemporaryDirectory(prefix="ddp_doctor_") as out_dir:
        report, ran = _launch(script, nproc, args, timeout, show, env, nodes, extra_env, cwd, out_dir, SITE_DIR)
        if not ran:
            return report, None
        record = read_record(Path(out_dir), nproc * nodes)
        if keep is not None:
            shutil.copytree(out_dir, keep, dirs_exist_ok=True)
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
    hint = (": the script's flag is taken for torchrun's own (torchrun reads an option that is a prefix of one of"
            " its own as its own, after the script's name too, and refuses an ambiguous one, --flag=value as well);"
            " put -- between the script and its arguments, which torchrun drops (the doctor's command then has two:"
            " doctor train.py -n 2 -- -- --flag value), or rename the flag") if "ambiguous option" in line else ""
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
