"""What every exercise check shares: load the learner's file, run it at several world sizes in ONE launch, report.

A check is a script run under torchrun by lessons.check, never by the learner. It imports the learner's file by
path, calls the learner's functions on cases the learner did not try, *measures* what they did (never reads what
they print), and reports in one of two ways:

* every case passed: rank 0 prints ``RESULT {"passed": true, "summary": ...}`` and every rank exits 0;
* a case failed: that rank prints ``EXERCISE FAIL {"hint": ..., "detail": ...}`` and exits (code 3); torchrun
  then stops the other ranks, and lessons.check turns the lowest rank's line into ``FAIL NAME: hint``.

World sizes: launching torchrun once per world size costs an import of torch per rank each time. So the launch
starts the largest world, and ``worlds(2, 3, 5)`` forms a real default process group of 2, then 3, then 5 ranks
in turn (a fresh key prefix in the launch's store each time); ranks beyond the current size wait for the next.
"""
from __future__ import annotations

import datetime
import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  before init_process_group (see ddp_scripts/ddp_common.py)

START_LINE = "EXERCISE START"  # every rank prints it once set up: the check's timeout counts from here
FAIL_PREFIX = "EXERCISE FAIL "
CASE_PREFIX = "EXERCISE CASE "  # what is being checked now: lessons.check names it when a launch hangs
RANK = int(os.environ.get("RANK", 0))
GROUP_TIMEOUT = datetime.timedelta(seconds=120)  # the launch's own timeout (lessons.check) comes first
RANK0_WAIT_S = 5  # fail(): how long another rank waits for rank 0's report (it comes within milliseconds if at all)

# The checkout's exercises/, or, installed from a wheel, the same files as lessons/_exercises (pyproject.toml)
EXERCISES = next(p for p in (Path(__file__).resolve().parents[3] / "exercises",
                             Path(__file__).resolve().parents[2] / "_exercises") if p.is_dir())

_store = None
_answer_store = None  # set by several.py in the process that checks one answer of several


class ExerciseFailure(Exception):
    """Raised by the check's own instruments (e.g. a collective called where none is allowed): becomes the hint."""


def fail(hint: str, detail: str = "") -> None:
    """Report this rank's failure and exit at once: no teardown that could hang on a rank that is gone.

    lessons.check shows the lowest failing rank's hint. When every rank finds the same mistake, whichever exits first
    gets the others stopped by torchrun (0.1 s later), perhaps before rank 0 has printed: so a rank other than 0
    waits, on the launch's store, until rank 0 has reported too (or for RANK0_WAIT_S, when rank 0 has not failed)."""
    print(FAIL_PREFIX + json.dumps({"rank": RANK, "hint": hint, "detail": detail}), flush=True)
    sys.stderr.flush()
    if _store is not None:
        if RANK == 0:
            _store.set("exercise_failed/0", "yes")
        else:
            try:
                _store.wait(["exercise_failed/0"], datetime.timedelta(seconds=RANK0_WAIT_S))
            except dist.DistStoreError:  # rank 0 did not fail (it may wait for this rank in a collective)
                pass
    os._exit(3)


def passed(summary: str, **extra) -> None:
    """Every rank: leave the last group cleanly; rank 0 reports."""
    if RANK == 0:
        print("RESULT " + json.dumps({"passed": True, "summary": summary, **extra}), flush=True)
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: gloo's threads can abort it (ddp_scripts/ddp_common.py)


def case(text: str) -> None:
    print(CASE_PREFIX + text, flush=True)


# The harness's arguments, kept: a check that runs a learner's script as __main__ replaces sys.argv.
LEARNER, WORKDIR = (Path(sys.argv[1]), Path(sys.argv[2])) if len(sys.argv) > 2 else (None, None)


def learner_path() -> Path:
    return LEARNER


def load_learner(*names: str):
    """Import the learner's file by path; a missing function or an error on import is one clear line."""
    path = learner_path()
    spec = importlib.util.spec_from_file_location(f"learner_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException as error:  # SystemExit too: a learner's file must not end the check on import
        traceback.print_exc()
        fail(f"{path.name} raised while it was imported: {type(error).__name__}: {error}")
    missing = [n for n in names if not callable(getattr(module, n, None))]
    if missing:
        fail(f"{path.name} defines no function {', '.join(missing)}: the exercise asks for "
             + ", ".join(f"{n}()" for n in names))
    return module


def call(function, *args, hint_for=None, **kwargs):
    """Call the learner's function: an exception becomes one line naming the function, the rank and the world
    (``hint_for(error)`` may add what that exception usually means)."""
    try:
        return function(*args, **kwargs)
    except ExerciseFailure as failure:
        fail(str(failure))
    except BaseException as error:
        traceback.print_exc()
        world = dist.get_world_size() if dist.is_initialized() else "?"
        first = str(error).splitlines()[0] if str(error) else ""
        extra = hint_for(error) if hint_for else None
        fail(f"{function.__name__}() raised on rank {RANK} with {world} ranks: {type(error).__name__}: {first}"
             + (f" ({extra})" if extra else ""))


def start() -> None:
    """Rendezvous once with every rank of the launch, keep its store, and print the start line."""
    global _store
    if _answer_store is not None:  # one answer of several in this launch (several.py): its own keys
        dist.init_process_group("gloo", store=_answer_store, rank=RANK, world_size=int(os.environ["WORLD_SIZE"]),
                                timeout=GROUP_TIMEOUT)
        _store = _answer_store
    else:
        dist.init_process_group("gloo", timeout=GROUP_TIMEOUT)
        _store = dist.distributed_c10d._get_default_store()
    # Every rank has finished connecting before any rank closes its connections: without it, a loaded machine
    # saw one rank still in gloo's connectFullMesh get "Connection closed by peer" from a rank already past it.
    dist.barrier()
    dist.destroy_process_group()
    print(START_LINE, flush=True)


def worlds(*sizes: int):
    """For each size: a default process group of that many ranks (this rank's, if it is one of them)."""
    if _store is None:
        start()
    for size in sizes:
        if RANK < size:
            dist.init_process_group("gloo", store=dist.PrefixStore(f"exercise_world_{size}", _store),
                                    rank=RANK, world_size=size, timeout=GROUP_TIMEOUT)
            yield size
            dist.barrier()  # the learner's last operations are done everywhere before the group goes
            dist.destroy_process_group()


def all_ranks(value):
    """Every rank's value (a Python object), in rank order, with torch's own all_gather_object."""
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered
