"""Launch a real DDP script with torchrun, from a notebook cell or a test.

DDP cannot run inside a Jupyter kernel (one process per device, collectives that
block, functions pickled by reference to ``__main__``). So the course writes a script
and runs it here, through torchrun itself (``python -m torch.distributed.run``):

* torchrun writes each rank's stdout/stderr to its own file (``--redirects 3``);
  we print them afterwards, rank by rank, so a cell's output is the same every run;
* rank 0's ``RESULT {json}`` line comes back as ``result.result``;
* a failing rank raises ``LaunchError`` that leads with *that rank's* traceback;
* a timeout or an interrupt stops torchrun **and** its workers. torchrun starts each
  worker in a session of its own, so killing torchrun's process group is not enough:
  we collect the whole process tree first and make sure every process in it is gone.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

MAX_NPROC = 32  # more ranks than this on one machine is a typo, not a lesson
RESULT_PREFIX = "RESULT "
STOP_GRACE_S = 5.0  # how long torchrun gets to stop its workers before we SIGKILL them

_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?", re.M)  # torch's excepthook labels lines
# The way a rank fails *because another rank died*: its peer closed the connection.
_PEER_FAILURE = re.compile(
    r"DistBackendError|Connection closed by peer|Connection reset by peer|Broken pipe"
    r"|ECONNRESET|EPIPE|timed out|Timeout|NCCL error|Socket Timeout",
)


class LaunchError(RuntimeError):
    """A launch failed; the message leads with the failing rank's own traceback.

    ``rank`` is that rank (None on a timeout, or when torchrun failed before any rank ran),
    ``root_cause`` the last line of its traceback, ``result`` what every rank printed.
    """

    def __init__(self, message: str, result: LaunchResult | None = None,
                 rank: int | None = None, root_cause: str | None = None):
        super().__init__(message)
        self.result = result
        self.rank = rank
        self.root_cause = root_cause


@dataclass
class LaunchResult:
    returncode: int
    stdout: dict[int, str] = field(default_factory=dict)
    stderr: dict[int, str] = field(default_factory=dict)
    result: dict | None = None  # rank 0's RESULT {json}
    command: list[str] = field(default_factory=list)
    launcher_log: str = ""  # torchrun's own output

    @property
    def outputs(self) -> dict[int, str]:
        """Everything each rank printed: stdout, then stderr."""
        ranks = sorted(set(self.stdout) | set(self.stderr))
        return {r: self.stdout.get(r, "") + self.stderr.get(r, "") for r in ranks}


def torchrun(
    script: str | os.PathLike,
    nproc: int = 2,
    args: tuple | list = (),
    timeout: float | None = 300,
    show: bool = True,
    threads_per_rank: int = 1,
    env: dict[str, str] | None = None,
) -> LaunchResult:
    """Run ``torchrun --standalone --nproc-per-node=NPROC SCRIPT ARGS`` and collect each rank.

    Raises ``LaunchError`` if a rank fails or the launch times out; a ``KeyboardInterrupt``
    (the kernel's stop button) stops every process of the launch and is re-raised.
    """
    script, nproc, args, timeout = _check_arguments(script, nproc, args, timeout, threads_per_rank)
    worker_env = {
        **os.environ,
        # torchrun would set 1 anyway and warn about it; we choose it explicitly.
        "OMP_NUM_THREADS": str(threads_per_rank),
        "PYTHONUNBUFFERED": "1",  # a rank that crashes has printed what it printed
        **(env or {}),
    }
    worker_env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's sockets on loopback

    with tempfile.TemporaryDirectory(prefix="ddp_lessons_") as log_dir:
        command = [
            sys.executable, "-m", "torch.distributed.run",
            "--standalone",  # one machine: rendezvous on a free port of this host
            "--local-addr=127.0.0.1",  # MASTER_ADDR for the workers: loopback, not the hostname
            f"--nproc-per-node={nproc}",
            f"--log-dir={log_dir}",
            "--redirects=3",  # each rank's stdout+stderr into its own file, not the console
            str(script), *args,
        ]
        launcher_log_path = Path(log_dir) / "torchrun.log"
        with open(launcher_log_path, "wb") as launcher_log:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL, stdout=launcher_log, stderr=subprocess.STDOUT,
                env=worker_env,
                start_new_session=True,  # our signals, not the terminal's, stop it
                preexec_fn=_die_with_parent,  # a killed kernel takes torchrun with it
            )
            try:
                returncode = _wait(proc, timeout)
            except BaseException:  # KeyboardInterrupt from the kernel, or anything else
                _stop_launch(proc)
                raise
            if returncode is None:
                stopped = _stop_launch(proc)
                partial = _collect(log_dir, launcher_log_path, -9, command)
                if show:
                    _print_ranks(partial)
                raise LaunchError(
                    f"{script.name} timed out after {timeout:g} s; stopped torchrun and "
                    f"{stopped} worker process(es). Output so far is in .result.outputs.",
                    partial,
                )
        launch = _collect(log_dir, launcher_log_path, returncode, command)

    if show:
        _print_ranks(launch)
    if returncode != 0:
        raise _failure(script, launch)
    return launch


def command_line(script: str | os.PathLike, nproc: int = 2, args: tuple | list = ()) -> str:
    """The command a learner would type in a terminal for the same launch."""
    return shlex.join(["torchrun", "--standalone", f"--nproc-per-node={nproc}", str(script), *map(str, args)])


# -- argument checks: one clear line each ----------------------------------------------

def _check_arguments(script, nproc, args, timeout, threads_per_rank):
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
    if isinstance(threads_per_rank, bool) or not isinstance(threads_per_rank, int) or threads_per_rank < 1:
        raise ValueError(f"threads_per_rank must be an int >= 1, got {threads_per_rank!r}")
    return script, nproc, [str(a) for a in args], timeout


# -- running and stopping --------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)  # loaded here, not in the forked child
_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    # In the child between fork and exec: if the kernel (our parent) dies, torchrun
    # gets SIGTERM and stops its workers, instead of running on as an orphan.
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _wait(proc: subprocess.Popen, timeout: float | None) -> int | None:
    """Return torchrun's exit code, or None on timeout. Short waits keep Ctrl-C responsive."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            return proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() > deadline:
                return None


def _stop_launch(proc: subprocess.Popen) -> int:
    """Stop torchrun and every process it started; return how many workers were stopped."""
    try:
        launcher = psutil.Process(proc.pid)
        workers = launcher.children(recursive=True)  # ranks, and their DataLoader workers
    except psutil.NoSuchProcess:
        launcher, workers = None, []
    # First ask torchrun: on SIGTERM it sends SIGTERM to each worker and waits.
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    tree = workers + ([launcher] if launcher else [])
    _, alive = psutil.wait_procs(tree, timeout=STOP_GRACE_S)
    # Whatever is left (a rank stuck in C++, torchrun itself) is killed outright. The
    # workers are in sessions of their own, so each is killed by pid, not by group.
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=STOP_GRACE_S)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    return len(workers)


# -- reading what the ranks printed ----------------------------------------------------

def _collect(log_dir: str, launcher_log: Path, returncode: int, command: list[str]) -> LaunchResult:
    stdout, stderr = {}, {}
    # torchrun's layout: LOG_DIR/<run id>/attempt_0/<local rank>/{stdout,stderr}.log
    for rank_dir in Path(log_dir).glob("*/attempt_*/*"):
        if rank_dir.name.isdigit():
            rank = int(rank_dir.name)
            stdout[rank] = _read(rank_dir / "stdout.log")
            stderr[rank] = _read(rank_dir / "stderr.log")
    launch = LaunchResult(
        returncode=returncode, stdout=dict(sorted(stdout.items())), stderr=dict(sorted(stderr.items())),
        command=command, launcher_log=_read(launcher_log),
    )
    launch.result = parse_result(launch.stdout.get(0, ""))
    return launch


def _read(path: Path) -> str:
    try:  # bytes, not read_text(): universal newlines would turn tqdm's "\r" redraws into lines
        return path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def parse_result(text: str) -> dict | None:
    """The JSON of the last `RESULT {...}` line in a script's output, or None."""
    for line in reversed(text.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    return None


def as_terminal_shows(text: str) -> str:
    """Collapse carriage-return redraws (tqdm bars) to what a terminal finally shows."""
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))


def _print_ranks(launch: LaunchResult) -> None:
    for rank in sorted(set(launch.stdout) | set(launch.stderr)):
        for text, stream in ((launch.stdout.get(rank, ""), sys.stdout), (launch.stderr.get(rank, ""), sys.stderr)):
            text = as_terminal_shows(text).rstrip("\n")
            if text:
                stream.write("".join(f"[rank{rank}] {line}\n" for line in text.split("\n")))
                stream.flush()  # keep stdout and stderr blocks in rank order


# -- explaining a failure --------------------------------------------------------------

def _rank_exit_codes(launcher_log: str) -> dict[int, int]:
    """Exit codes from torchrun's failure summary ("rank : 1 (local_rank: 1)" / "exitcode : -6")."""
    codes = {}
    for block in re.split(r"\n\[\d+\]:\n", launcher_log):
        rank = re.search(r"rank\s*:\s*(\d+)", block)
        code = re.search(r"exitcode\s*:\s*(-?\d+)", block)
        if rank and code:
            codes[int(rank.group(1))] = int(code.group(1))
    return codes


def _root_cause_rank(launch: LaunchResult, codes: dict[int, int]) -> int | None:
    """The rank that failed first: one whose own code raised, rather than one that lost its peer."""
    with_traceback = [r for r, err in launch.stderr.items() if "Traceback (most recent call last)" in err]
    own_errors = [r for r in with_traceback if not _PEER_FAILURE.search(_last_exception(launch.stderr[r]))]
    for candidates in (own_errors, with_traceback, [r for r, c in codes.items() if c != 0 and c != -15]):
        if candidates:
            return min(candidates)
    return min(codes) if codes else None


def _last_exception(stderr: str) -> str:
    lines = [ln for ln in _RANK_PREFIX.sub("", stderr).splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _traceback_of(stderr: str) -> str:
    text = _RANK_PREFIX.sub("", stderr)
    start = text.rfind("Traceback (most recent call last)")
    if start < 0:
        return "\n".join(text.rstrip().splitlines()[-15:])
    return text[start:].rstrip()


def _failure(script: Path, launch: LaunchResult) -> LaunchError:
    codes = _rank_exit_codes(launch.launcher_log)
    rank = _root_cause_rank(launch, codes)
    if rank is None:  # torchrun failed before any rank ran
        tail = "\n".join(launch.launcher_log.rstrip().splitlines()[-20:])
        return LaunchError(f"torchrun failed (exit code {launch.returncode}) before any rank reported:\n{tail}", launch)
    code = codes.get(rank)
    how = f"exit code {code}" if code is not None and code >= 0 else (
        f"signal {signal.Signals(-code).name}" if code is not None else "an error")
    traceback = _traceback_of(launch.stderr.get(rank, ""))
    message = f"rank {rank} of {script.name} failed ({how}):\n{traceback}"
    others = sorted(r for r in codes if r != rank)
    if others:
        message += "\n(other ranks: " + ", ".join(_describe_exit(r, codes[r]) for r in others) + ")"
    root_cause = traceback.splitlines()[-1] if traceback else how
    return LaunchError(message, launch, rank=rank, root_cause=root_cause)


def _describe_exit(rank: int, code: int) -> str:
    if code == -signal.SIGTERM:
        return f"rank {rank} stopped by torchrun"
    if code < 0:
        return f"rank {rank} killed by {signal.Signals(-code).name}"
    return f"rank {rank} exit code {code}"
