"""Launch a script with plain ``python``: for launchers other than torchrun (``mp.spawn``,
``torch.multiprocessing.start_processes``) and scripts that start their ranks themselves.

The same guarantees as ``torchrun()``: a timeout or a Ctrl-C stops the script *and* every process it
started; a failure raises ``LaunchError``. There are no per-rank log files here (the ranks share one
stdout), so lines that start with ``rank N`` are shown grouped by N, in order: the same every run.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

from . import processes
from .failure import LaunchError, last_exception, traceback_of
from .launch import _check_arguments, loopback_interface
from .rank_output import RESULT_PREFIX, LaunchResult, parse_result, read

_RANK_LINE = re.compile(r"^rank (\d+)\b")


def run_python(script: str | os.PathLike, args: tuple | list = (), timeout: float | None = 120,
               show: bool = True, env: dict[str, str] | None = None, threads_per_rank: int = 1) -> LaunchResult:
    """Run ``python SCRIPT ARGS``; rank 0's ``RESULT {json}`` is ``.result``."""
    script, _, args, timeout = _check_arguments(script, 1, args, timeout, threads_per_rank, 0)
    child_env = {**os.environ, "OMP_NUM_THREADS": str(threads_per_rank), "GLOO_SOCKET_IFNAME": loopback_interface(),
                 **(env or {})}
    # Ranks share one stdout: each print() must reach it as one write, which PYTHONUNBUFFERED would split.
    child_env.pop("PYTHONUNBUFFERED", None)
    command = [sys.executable, str(script), *args]
    with tempfile.TemporaryDirectory(prefix="ddp_lessons_") as log_dir:
        stdout_path, stderr_path = Path(log_dir) / "stdout", Path(log_dir) / "stderr"
        with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
            proc = processes.start(command, child_env, stdout, stderr=stderr)
            try:
                returncode = processes.wait(proc, timeout)
            except BaseException:
                with processes.interrupts_ignored():
                    processes.stop_tree(proc)
                raise
            if returncode is None:
                stopped = processes.stop_tree(proc)
        launch = LaunchResult(returncode=-9 if returncode is None else returncode, command=command,
                              stdout=by_rank(read(stdout_path)), stderr={0: read(stderr_path)})
    launch.result = parse_result("\n".join(launch.stdout.values()))
    if show:
        print_output(launch)
    if returncode is None:
        raise LaunchError(f"{script.name} timed out after {timeout:g} s; stopped it and {stopped} process(es) "
                          "it started. Output so far is in .result.", launch)
    if returncode != 0:
        stderr_text = launch.stderr[0]
        last = last_exception(stderr_text)
        detail = last if "Traceback" not in stderr_text else traceback_of(stderr_text)
        raise LaunchError(f"{script.name} failed (exit code {returncode}): {detail}", launch, root_cause=last)
    return launch


def by_rank(text: str) -> dict[int, str]:
    """Group the lines a script's ranks printed by their leading "rank N"; other lines go under -1,
    except RESULT lines, which rank 0 prints (the course's convention)."""
    groups: dict[int, list[str]] = {}
    for line in text.splitlines():
        match = _RANK_LINE.match(line)
        rank = int(match.group(1)) if match else 0 if line.startswith(RESULT_PREFIX) else -1
        groups.setdefault(rank, []).append(line)
    return {rank: "\n".join(lines) + "\n" for rank, lines in sorted(groups.items())}


def print_output(launch: LaunchResult) -> None:
    for text in launch.stdout.values():
        sys.stdout.write(text)
    sys.stdout.flush()
    if launch.stderr.get(0):
        sys.stderr.write(launch.stderr[0])
        sys.stderr.flush()
