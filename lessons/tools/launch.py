"""Launch a real DDP script with torchrun, from a notebook cell or a test: the one entry point.

DDP runs one process per device, and a notebook kernel is one process. So the course writes a
script and runs it here, through torchrun itself (``python -m torch.distributed.run``):

* torchrun writes each rank's stdout/stderr to its own file (``--redirects 3``); we print them
  afterwards, rank by rank, so a cell's output is the same every run (rank_output.py);
* rank 0's ``RESULT {json}`` line comes back as ``result.result``;
* a failing rank raises ``LaunchError`` that leads with *that rank's* traceback (failure.py);
* while it runs, the ranks' lines are shown as they come (live.py);
* a timeout first takes every rank's Python stack with py-spy (stacks.py), then stops torchrun **and**
  its workers (processes.py); with ``timeout_from=`` it counts from a line every rank prints, so a planted
  hang can get a short timeout that the ranks' start-up (three imports of torch) does not eat into;
* ``max_restarts=`` is torchrun's ``--max-restarts``; each attempt's output is kept apart.
"""
from __future__ import annotations

import os
import shlex
import sys
import tempfile
from pathlib import Path

from . import processes
from .failure import LaunchError, failure
from .live import LiveOutput, RankLines, StartLine, in_jupyter
from .stacks import dump_ranks, where
from .processes import STOP_GRACE_S  # noqa: F401  (tests read it from here)
from .rank_output import LaunchResult, as_terminal_shows, collect, parse_result, print_ranks

__all__ = ["LaunchError", "LaunchResult", "as_terminal_shows", "command_line", "parse_result", "torchrun"]

MAX_NPROC = 32  # more ranks than this on one machine is a typo, not a lesson
MAX_RESTARTS = 10
START_LIMIT_S = 120  # with timeout_from=: how long the ranks get to print the start line
# torchrun itself, and the deprecated launcher that wraps it (it adds --local-rank=N to the script's arguments).
LAUNCHER_MODULES = {"torchrun": "torch.distributed.run", "torch.distributed.launch": "torch.distributed.launch"}


def torchrun(
    script: str | os.PathLike,
    nproc: int = 2,
    args: tuple | list = (),
    timeout: float | None = 300,
    show: bool = True,
    threads_per_rank: int = 1,
    env: dict[str, str] | None = None,
    max_restarts: int = 0,
    launcher: str = "torchrun",
    live: bool | None = None,
    timeout_from: str | dict[int, str] | None = None,
    cwd: str | os.PathLike | None = None,
) -> LaunchResult:
    """Run ``torchrun --standalone --nproc-per-node=NPROC SCRIPT ARGS`` and collect each rank.

    Raises ``LaunchError`` if a rank fails (in the last attempt) or the launch times out; a
    ``KeyboardInterrupt`` (the kernel's stop button) stops every process of the launch and is re-raised.
    ``launcher="torch.distributed.launch"`` runs the deprecated launcher instead (lesson 10).
    ``live``: show the ranks' lines while the launch runs; by default in Jupyter and in a terminal.
    ``timeout_from``: the timeout counts from the moment every rank has printed a line containing this text
    (until then the launch gets START_LIMIT_S seconds). For a hang on purpose: the time to start doesn't count.
    ``{rank: text}`` gives each rank its own line: the clock then starts at the event that makes the hang (one
    rank leaving a loop, say), however long the others took to get there.
    ``cwd``: the ranks' working folder (by default this process's).
    """
    script, nproc, args, timeout = _check_arguments(script, nproc, args, timeout, threads_per_rank, max_restarts,
                                                    timeout_from)
    if launcher not in LAUNCHER_MODULES:
        raise ValueError(f"launcher must be one of {sorted(LAUNCHER_MODULES)}, got {launcher!r}")
    worker_env = launch_environment(env, threads_per_rank, store_per_round=max_restarts > 0)

    with tempfile.TemporaryDirectory(prefix="ddp_lessons_") as log_dir:
        command = [sys.executable, "-m", LAUNCHER_MODULES[launcher],
                   *_torchrun_flags(nproc, max_restarts),
                   f"--log-dir={log_dir}",
                   "--redirects=3",  # each rank's stdout+stderr into its own file, not the console
                   str(script), *args]
        launcher_log_path = Path(log_dir) / "torchrun.log"
        if live is None:
            live = in_jupyter() or sys.stdout.isatty()
        live_output = LiveOutput() if show and live else None
        rank_lines = RankLines(log_dir)
        start_line = StartLine(timeout_from, nproc) if timeout_from else None

        pids = None  # after a restart, which pid was which rank (see processes.WorkerPids)

        def on_tick():
            if pids:
                pids.poll()
            lines = rank_lines.read() if live_output or start_line else []
            if live_output:
                live_output.show(lines)
            if start_line:
                start_line.see(lines)
        # A terminal has seen the lines as they came; a notebook gets them again, rank by rank.
        print_at_end = show and not (live_output and not live_output.jupyter)
        with open(launcher_log_path, "wb") as launcher_log:
            proc = processes.start(command, worker_env, launcher_log, cwd=cwd)
            if max_restarts > 0:
                pids = processes.WorkerPids(proc.pid)
            try:
                returncode = processes.wait(proc, timeout, on_tick=on_tick,
                                            clock_start=(lambda: start_line.at) if start_line else None,
                                            start_limit=START_LIMIT_S)
            except BaseException:  # KeyboardInterrupt from the kernel, or anything else
                with processes.interrupts_ignored():
                    processes.stop_tree(proc)
                raise
            finally:
                if live_output:
                    live_output.close()
            if returncode is None:
                stacks, no_stacks = dump_ranks(proc.pid)  # before anything is stopped: where is each rank?
                stopped = processes.stop_tree(proc)
                partial = collect(log_dir, launcher_log_path, -9, command)
                partial.stacks = stacks
                if print_at_end:
                    print_ranks(partial)
                places = [f"  rank {rank}: {where(dump, script.name)}" for rank, dump in stacks.items()]
                if not start_line:
                    what = f"{script.name} timed out after {timeout:g} s."
                elif start_line.at is not None:
                    what = f"{script.name} timed out {timeout:g} s after every rank printed {start_line.wanted()}."
                else:
                    missing = start_line.missing()
                    what = (f"{script.name} timed out: not every rank printed {start_line.wanted()} within"
                            f" {START_LIMIT_S:g} s ({'rank' if len(missing) == 1 else 'ranks'}"
                            f" {', '.join(map(str, missing))} did not).")
                raise LaunchError(
                    f"{what} Where each rank was:\n"
                    + "\n".join(places + ([f"  {no_stacks}"] if no_stacks else []))
                    + f"\nStopped torchrun and {stopped} worker process(es). The full stacks are in"
                    " .result.stacks, the output so far in .result.outputs.",
                    partial,
                )
        launch = collect(log_dir, launcher_log_path, returncode, command, pids.workers if pids else None)

    if print_at_end:
        print_ranks(launch)
    if returncode != 0:
        raise failure(script, launch)
    return launch


def loopback_interface(platform: str | None = None) -> str:
    """The loopback interface's name, for GLOO_SOCKET_IFNAME: gloo then keeps its sockets on this machine.
    "lo" on Linux (WSL2 included: it runs a Linux kernel); "lo0" on macOS and the BSDs."""
    platform = sys.platform if platform is None else platform
    return "lo0" if platform == "darwin" or platform.startswith(("freebsd", "openbsd", "netbsd")) else "lo"


def launch_environment(env: dict[str, str] | None, threads_per_rank: int = 1,
                       store_per_round: bool = False) -> dict[str, str]:
    """The environment of a torchrun agent and its workers; ``env`` has the last word."""
    worker_env = {
        **os.environ,
        # torchrun would set 1 anyway and warn about it; we choose it explicitly.
        "OMP_NUM_THREADS": str(threads_per_rank),
        "PYTHONUNBUFFERED": "1",  # a rank that crashes has printed what it printed
        **(env or {}),
    }
    worker_env.setdefault("GLOO_SOCKET_IFNAME", loopback_interface())  # gloo's sockets on loopback
    if store_per_round:
        # torch 2.14: a group that restarts (lesson 07b) or re-forms (elastic, lesson 10) reuses the agent's store,
        # which still holds the last round's keys; the new round may then fail with "Connection refused" or hang
        # (measured; pytorch/pytorch#135712). With this opt-out each round gets a fresh store.
        worker_env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return worker_env


def _torchrun_flags(nproc: int, max_restarts: int) -> list[str]:
    return ["--standalone",  # one machine: rendezvous on a free port of this host
            "--local-addr=127.0.0.1",  # MASTER_ADDR for the workers: loopback, not the hostname
            f"--nproc-per-node={nproc}",
            *([f"--max-restarts={max_restarts}"] if max_restarts else [])]


def command_line(script: str | os.PathLike, nproc: int = 2, args: tuple | list = (), max_restarts: int = 0,
                 threads_per_rank: int = 1) -> str:
    """The terminal command for the same launch: what torchrun() runs, with the environment it sets.
    Left out: --log-dir and --redirects=3, which torchrun() adds to keep each rank's output apart; in a
    terminal you want it on the console, where the ranks' lines interleave."""
    env = [f"OMP_NUM_THREADS={threads_per_rank}", f"GLOO_SOCKET_IFNAME={loopback_interface()}"]
    if max_restarts:
        env.append("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")
    return shlex.join([*env, "torchrun", *_torchrun_flags(nproc, max_restarts), str(script), *map(str, args)])


def _check_arguments(script, nproc, args, timeout, threads_per_rank, max_restarts, timeout_from=None):
    """Bad input: one clear line each."""
    if not isinstance(script, (str, os.PathLike)):
        raise TypeError(f"script must be a path to a .py file, not {type(script).__name__}")
    script = Path(script)
    if not script.is_file():
        raise FileNotFoundError(f"no such script: {script} (cwd is {os.getcwd()})")
    if isinstance(nproc, bool) or not isinstance(nproc, int):
        raise TypeError(f"nproc must be an int, not {type(nproc).__name__}")
    if not 1 <= nproc <= MAX_NPROC:
        raise ValueError(f"nproc must be between 1 and {MAX_NPROC}, got {nproc}")
    if isinstance(args, (str, bytes)) or not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a list or tuple of arguments, not {type(args).__name__}")
    for a in args:
        if isinstance(a, bool) or not isinstance(a, (str, int, float, os.PathLike)):
            raise TypeError(f"each arg must be a str or number, not {type(a).__name__}: {a!r}")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be seconds (a number) or None, not {type(timeout).__name__}")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
    if timeout_from is not None:
        lines = timeout_from.values() if isinstance(timeout_from, dict) else [timeout_from]
        if (timeout is None or not all(isinstance(line, str) and line for line in lines)
                or isinstance(timeout_from, dict) and sorted(timeout_from) != list(range(nproc))):
            raise ValueError("timeout_from must be a non-empty line of text, or {rank: line} for every rank, with a"
                             f" timeout, got {timeout_from!r}")
    if isinstance(threads_per_rank, bool) or not isinstance(threads_per_rank, int) or threads_per_rank < 1:
        raise ValueError(f"threads_per_rank must be an int >= 1, got {threads_per_rank!r}")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or not 0 <= max_restarts <= MAX_RESTARTS:
        raise ValueError(f"max_restarts must be an int from 0 to {MAX_RESTARTS}, got {max_restarts!r}")
    return script, nproc, [str(a) for a in args], timeout
