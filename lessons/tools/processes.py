"""Starting a launch, waiting for it, and stopping its whole process tree.

torchrun starts each worker in a session of its own, so killing torchrun's process group is
not enough: we collect the tree first and make sure every process in it is gone.
"""
from __future__ import annotations

import contextlib
import ctypes
import io
import os
import signal
import subprocess
import tempfile
import time
from unittest import mock

import psutil

STOP_GRACE_S = 5.0  # how long torchrun gets to stop its workers before we SIGKILL them
AGENT_EXIT_S = 30.0  # after the timeout: how long torchrun gets to exit once every rank has ended

_libc = ctypes.CDLL(None, use_errno=True)  # loaded here, not in the forked child
_PR_SET_PDEATHSIG = 1


def die_with_parent():
    """In the child between fork and exec: if the kernel (our parent) dies, torchrun gets
    SIGTERM and stops its workers, instead of running on as an orphan."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def start(command: list[str], env: dict, log_file, stderr=subprocess.STDOUT, cwd=None) -> subprocess.Popen:
    return subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=stderr, env=env, cwd=cwd,
        start_new_session=True,  # our signals, not the terminal's, stop it
        preexec_fn=die_with_parent,  # a killed kernel takes torchrun with it
    )


def wait(proc: subprocess.Popen, timeout: float | None, on_tick=None, clock_start=None,
         start_limit: float | None = None) -> int | None:
    """Return torchrun's exit code, or None on timeout (while a rank still runs). Short waits keep Ctrl-C responsive;
    ``on_tick()`` runs between them (the live output). With ``clock_start`` (a function that gives the
    time.monotonic() at which the timeout starts counting, or None until then), the timeout counts from that
    moment, and until it comes the launch gets ``start_limit`` seconds."""
    began = time.monotonic()
    while True:
        try:
            code = proc.wait(timeout=0.1)
            if on_tick:
                on_tick()  # the last lines
            return code
        except subprocess.TimeoutExpired:
            if on_tick:
                on_tick()
            started = began if clock_start is None else clock_start()
            if started is None:
                if start_limit is not None and time.monotonic() > began + start_limit:
                    return None
            elif timeout is not None and time.monotonic() > started + timeout:
                # Counted from the ranks' start line, the timeout is the ranks': once every rank has ended, torchrun
                # is only finishing (its exit barrier, then Python's exit: seconds on a loaded machine), and gets
                # AGENT_EXIT_S more before the launch is called hung.
                finishing = clock_start is not None and not workers_alive(proc.pid)
                if not finishing or time.monotonic() > started + timeout + AGENT_EXIT_S:
                    return None


def workers_alive(launcher_pid: int) -> bool:
    """Does the launcher still have a child that runs (not one that has ended and waits to be reaped)?"""
    def runs(process):
        try:
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    try:
        return any(runs(child) for child in psutil.Process(launcher_pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return False


@contextlib.contextmanager
def interrupts_ignored():
    """While we stop a launch, a second Ctrl-C (the stop button pressed again) must not cut the clean-up short
    and leave workers behind. Only the main thread can set signal handlers; elsewhere there is no SIGINT to fear."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def stop_tree(proc: subprocess.Popen) -> int:
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


class WorkerPids:
    """Which worker each pid of a launch is: {pid: (attempt, local rank)}, read from each new child's environment.

    torchrun logs one failure per failed attempt, the one with the smallest timestamp, and its timestamps are whole
    seconds, taken from a rank's error file when it has one: a rank that lost its peer and wrote its error file in
    the second before the agent saw the killed rank is named instead, with the SIGTERM the agent then sent it. The
    pids let ``collect`` find the rank that really ended first (the one torchrun did not have to stop)."""

    def __init__(self, launcher_pid: int):
        self.launcher_pid = launcher_pid
        self.workers: dict[int, tuple[int, int]] = {}

    def poll(self) -> None:
        try:
            children = psutil.Process(self.launcher_pid).children()
        except psutil.NoSuchProcess:
            return
        for child in children:
            if child.pid in self.workers:
                continue
            try:
                env = child.environ()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if "LOCAL_RANK" in env:  # torchrun sets it before exec; a child too young to have it is read next tick
                self.workers[child.pid] = (int(env.get("TORCHELASTIC_RESTART_COUNT", 0)), int(env["LOCAL_RANK"]))


class Captured:
    text = ""  # filled in when the `with` block ends


@contextlib.contextmanager
def child_stderr():
    """Capture what child processes (e.g. mp.spawn's) write to file descriptor 2, their stderr.

    A notebook's sys.stderr is not fd 2, so children write past it; we point fd 2 at a file for the
    block. The children run line-buffered (PYTHONUNBUFFERED dropped for them): under PYTHONUNBUFFERED=1,
    Python 3.11 writes each ^ of a traceback with its own write(), and two children's lines interleave."""
    captured = Captured()
    with tempfile.TemporaryFile(mode="w+") as file, contextlib.redirect_stderr(io.StringIO()), \
            mock.patch.dict(os.environ):
        os.environ.pop("PYTHONUNBUFFERED", None)
        saved_fd = os.dup(2)
        os.dup2(file.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            file.seek(0)
            captured.text = file.read()


def running(script: str | os.PathLike) -> list[tuple[int, str]]:
    """What is running this script file now: (pid, "torchrun agent" or "rank N") for each process (lesson 11).

    A process matches when one of its arguments is this very file (resolved from the process's own working
    directory), so a copy of the script elsewhere, e.g. one that a test suite launches meanwhile, does not count.
    """
    target = os.path.realpath(script)
    name = os.path.basename(target)
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if not any(part.endswith(name) for part in cmdline):  # cheap filter before asking for the cwd
            continue
        try:
            cwd = proc.cwd()
            rank = proc.environ().get("RANK")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if not any(os.path.realpath(os.path.join(cwd, part)) == target for part in cmdline if part.endswith(name)):
            continue
        role = "torchrun agent" if "torch.distributed.run" in cmdline else f"rank {rank}"
        found.append((proc.info["pid"], role))
    return sorted(found, key=lambda pid_role: pid_role[1])
