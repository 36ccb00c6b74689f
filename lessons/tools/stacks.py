"""Where is each rank stuck? A Python stack dump of every rank with py-spy, taken before a hung
launch is stopped (``py-spy dump --pid``; it needs ptrace, which root has)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psutil

DUMP_TIMEOUT_S = 10.0
_FRAME = re.compile(r"^\s+(\S+) \((.+):(\d+)\)$")  # py-spy: "    main (hang.py:14)"
# py-spy colours its output when CLICOLOR_FORCE is set, and a Jupyter kernel sets it: the dump is run
# without it, and any colour codes left are removed.
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def py_spy() -> str | None:
    beside_python = Path(sys.executable).parent / "py-spy"  # the venv's, even when it is not on PATH
    return str(beside_python) if beside_python.exists() else shutil.which("py-spy")


def worker_ranks(launcher_pid: int) -> dict[int, int]:
    """rank -> pid of torchrun's workers (its children that torchrun gave a RANK)."""
    ranks = {}
    try:
        children = psutil.Process(launcher_pid).children()
    except psutil.NoSuchProcess:
        return ranks
    for child in children:
        try:
            rank = child.environ().get("RANK")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if rank is not None and rank.isdigit():
            ranks[int(rank)] = child.pid
    return dict(sorted(ranks.items()))


def dump_ranks(launcher_pid: int) -> tuple[dict[int, str], str | None]:
    """({rank: py-spy's dump}, None), or ({...what worked}, one line saying why stacks are missing)."""
    tool = py_spy()
    if tool is None:
        return {}, "no stacks: py-spy is not installed (pip install py-spy)"
    dumps, failures = {}, []
    without_colour = {**{k: v for k, v in os.environ.items() if k != "CLICOLOR_FORCE"}, "NO_COLOR": "1"}
    for rank, pid in worker_ranks(launcher_pid).items():
        try:
            done = subprocess.run([tool, "dump", "--full-filenames", "--pid", str(pid)], capture_output=True, text=True,
                                  timeout=DUMP_TIMEOUT_S, env=without_colour)
        except subprocess.TimeoutExpired:
            failures.append(f"rank {rank}: py-spy took over {DUMP_TIMEOUT_S:g} s")
            continue
        if done.returncode == 0:
            dumps[rank] = _COLOUR.sub("", done.stdout)
        else:
            reason = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            failures.append(f"rank {rank}: {reason}")
    if failures:
        return dumps, "py-spy could not dump every rank (it needs ptrace: root, or kernel.yama.ptrace_scope=0): " \
            + "; ".join(failures)
    return dumps, None


def where(dump: str, script: str) -> str:
    """One line from a dump: the innermost function <- the script's own frame, e.g.
    "all_reduce <- main (hang.py:14)"; the main thread's stack."""
    frames = []
    main_thread = dump.split("\nThread ", 2)[1] if "\nThread " in dump else ""  # py-spy lists the main thread first
    for line in main_thread.splitlines()[1:]:
        match = _FRAME.match(line)
        if not match:
            break
        frames.append((match.group(1), match.group(2), int(match.group(3))))
    if not frames:
        return "no Python frames"
    name = Path(script).name
    own = next(((f, path, n) for f, path, n in frames if Path(path).name == name), None)
    innermost = frames[0]
    if own is None:
        return f"{innermost[0]} ({Path(innermost[1]).name}:{innermost[2]})"
    function, path, number = own
    at = f"{function} ({name}:{number})"
    if own == innermost:  # stuck in the script's own line: a call into C, e.g. time.sleep; show the line
        source = _source_line(path, number)
        return f"{at}: {source}" if source else at
    return f"{innermost[0]} \u2190 {at}"


def _source_line(path: str, number: int) -> str:
    try:
        return Path(path).read_text().splitlines()[number - 1].strip()
    except (OSError, IndexError):
        return ""
