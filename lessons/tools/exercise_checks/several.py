"""Several answers, to one exercise or to several that launch as many ranks, in ONE launch:
``several.py WORKDIR NAME TIMEOUT PATH [NAME TIMEOUT PATH ...]`` (lessons.check.check_exercises).

A launch's cost is its start (torch imported by torchrun's agent and by every rank), not the check. So each rank
imports torch and the torch modules the checks import once, then, for each answer in turn, forks a process that
imports the answer's check and runs its ``main()`` on that answer exactly as a launch of its own would (same ranks,
same worlds, its own keys in the launch's store, its output in WORKDIR/answer_I/rank_R.txt; a check that replaces
torch.save or a collective when imported does so in that process alone). What torchrun does for one launch, each
rank's parent does for its answer: when a rank's check ends with a failure, the others are stopped 0.1 s later
(torchrun's monitor interval); a check still running after its timeout is stopped as a hang. The next answer starts
once every rank's previous one is over. Used by the tests, which check many wrong answers; a learner's check is one
launch.
"""
import ast
import datetime
import importlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

import torch.distributed as dist

import common

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
STOP_OTHERS_AFTER_S = 0.1  # torchrun's --monitor-interval: how soon the other ranks go after one failed
# The checks whose answers make an optimizer or a DDP model: the first of either imports torch._dynamo (about 1 CPU-s
# a process). Imported once per rank, before the forks, it is not imported again in every answer's process; the
# other checks would pay it for nothing.
IMPORT_DYNAMO_FIRST = {"average_gradients", "convert_to_ddp", "no_sync", "resume"}


def launch_store():
    """A connection of this process's own to the store of torchrun's agent."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=datetime.timedelta(seconds=120))


def torch_modules_of(name):
    """The torch modules check NAME imports at its top (read from its source, not imported: importing a check may
    replace torch.save or a collective)."""
    tree = ast.parse((Path(__file__).parent / f"{name}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.split(".")[0] == "torch")
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module.split(".")[0] == "torch":
            yield node.module


def run_answer(name, index, path, out):
    """In the forked process: the check's main() on one answer, printing to this rank's file."""
    fd = os.open(out / f"rank_{RANK}.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    common.LEARNER, common.WORKDIR = Path(path), out
    common._answer_store = dist.PrefixStore(f"several_answer_{index}", launch_store())
    try:
        harness = importlib.import_module(name)
        sys.argv = [harness.__file__, str(path), str(out)]
        harness.main()
    except SystemExit as end:
        sys.stdout.flush()
        os._exit(end.code if isinstance(end.code, int) else 1)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)


def wait_for(pid, index, store, timeout):
    """This rank's answer process to end: (exit code, or -signal, or None if stopped) and whether it timed out."""
    deadline, failed_seen = time.monotonic() + timeout, None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            return code, False
        now = time.monotonic()
        if now > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None, True
        if failed_seen is None and store.check([f"several/{index}/failed"]):
            failed_seen = now
        if failed_seen is not None and now - failed_seen > STOP_OTHERS_AFTER_S:
            os.kill(pid, signal.SIGKILL)  # as torchrun stops the ranks of a launch in which one has failed
            os.waitpid(pid, 0)
            return None, False
        time.sleep(0.02)


def main():
    workdir, rest = Path(sys.argv[1]), sys.argv[2:]
    answers = [(rest[i], float(rest[i + 1]), rest[i + 2]) for i in range(0, len(rest), 3)]
    names = dict.fromkeys(name for name, _, _ in answers)
    for module in [m for name in names for m in torch_modules_of(name)]:
        importlib.import_module(module)
    if IMPORT_DYNAMO_FIRST & set(names):
        importlib.import_module("torch._dynamo")
    store = launch_store()
    print(common.START_LINE, flush=True)
    for index, (name, timeout, path) in enumerate(answers):
        out = workdir / f"answer_{index}"
        out.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            run_answer(name, index, path, out)
        started = time.time()
        code, timed_out = wait_for(pid, index, store, timeout)
        if code not in (0, None):
            store.set(f"several/{index}/failed", str(RANK))
        (out / f"rank_{RANK}.json").write_text(json.dumps({"code": code, "timed_out": timed_out,
                                                            "ended": time.time(), "started": started}))
        store.set(f"several/{index}/done/{RANK}", "yes")
        store.wait([f"several/{index}/done/{r}" for r in range(WORLD)])
    if RANK == 0:
        print("RESULT " + json.dumps({"answers": len(answers)}), flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
