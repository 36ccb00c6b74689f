"""Reading what the ranks printed: torchrun's log directory, attempt by attempt, rank by rank."""
from __future__ import annotations

import json
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

RESULT_PREFIX = "RESULT "
# The way a rank fails *because another rank died*: its peer closed the connection.
PEER_FAILURE = re.compile(
    r"DistBackendError|Connection closed by peer|Connection reset by peer|Broken pipe"
    r"|ECONNRESET|EPIPE|timed out|Timeout|NCCL error|Socket Timeout",
)


@dataclass
class Attempt:
    """One start of the worker group. torchrun restarts every rank together (--max-restarts)."""
    number: int
    stdout: dict[int, str] = field(default_factory=dict)
    stderr: dict[int, str] = field(default_factory=dict)
    failure: str | None = None  # why this attempt ended, e.g. "rank 1 killed by SIGKILL"; None if it succeeded
    errors: dict[int, dict] = field(default_factory=dict)  # rank -> its error file, written by @record


@dataclass
class LaunchResult:
    returncode: int
    stdout: dict[int, str] = field(default_factory=dict)  # the last attempt's
    stderr: dict[int, str] = field(default_factory=dict)
    result: dict | None = None  # rank 0's RESULT {json}, from the last attempt
    command: list[str] = field(default_factory=list)
    launcher_log: str = ""  # torchrun's own output
    attempts: list[Attempt] = field(default_factory=list)  # every attempt, the last one included
    stacks: dict[int, str] = field(default_factory=dict)  # after a timeout: each rank's py-spy dump

    @property
    def outputs(self) -> dict[int, str]:
        """Everything each rank printed in the last attempt: stdout, then stderr."""
        ranks = sorted(set(self.stdout) | set(self.stderr))
        return {r: self.stdout.get(r, "") + self.stderr.get(r, "") for r in ranks}


# torchrun logs one line per failed attempt: "failed (exitcode: -9) local_rank: 1 (pid: 123) of binary: ..."
_ATTEMPT_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
# ... after "Sending process 123 closing signal SIGTERM" for each worker still running.
_STOPPED_BY_AGENT = re.compile(r"Sending process (\d+) closing signal SIGTERM")


def collect(log_dir: str, launcher_log: Path, returncode: int, command: list[str],
            worker_pids: dict[int, tuple[int, int]] | None = None) -> LaunchResult:
    """torchrun's layout: LOG_DIR/<run id>/attempt_<n>/<local rank>/{stdout,stderr}.log.
    ``worker_pids``: {pid: (attempt, local rank)}, to correct torchrun where it names a rank it stopped itself."""
    attempts: dict[int, Attempt] = {}
    for rank_dir in Path(log_dir).glob("*/attempt_*/*"):
        if rank_dir.name.isdigit():
            number = int(rank_dir.parent.name.removeprefix("attempt_"))
            attempt = attempts.setdefault(number, Attempt(number))
            attempt.stdout[int(rank_dir.name)] = read(rank_dir / "stdout.log")
            attempt.stderr[int(rank_dir.name)] = read(rank_dir / "stderr.log")
            error_file = rank_dir / "error.json"  # torchrun's TORCHELASTIC_ERROR_FILE for this worker
            if error_file.exists():
                try:
                    attempt.errors[int(rank_dir.name)] = json.loads(read(error_file))
                except ValueError:  # half-written by a rank that was killed meanwhile
                    pass
    ordered = []
    for number in sorted(attempts):
        a = attempts[number]
        ordered.append(Attempt(number, dict(sorted(a.stdout.items())), dict(sorted(a.stderr.items())),
                               errors=dict(sorted(a.errors.items()))))
    log = read(launcher_log)
    # Every attempt but the last ended in a failure that torchrun logged, in order.
    stopped_by_agent = {int(pid) for pid in _STOPPED_BY_AGENT.findall(log)}
    for attempt, (code, rank, _) in zip(ordered[:-1], _ATTEMPT_FAILED.findall(log)):
        attempt.failure = describe_exit(int(rank), int(code))
        if worker_pids and (int(code) == -signal.SIGTERM or _lost_its_peer(attempt, int(rank))):
            attempt.failure = _first_to_end(attempt, int(rank), worker_pids, stopped_by_agent) or attempt.failure
    last = ordered[-1] if ordered else Attempt(0)
    launch = LaunchResult(returncode=returncode, stdout=last.stdout, stderr=last.stderr, command=command,
                          launcher_log=log, attempts=ordered)
    launch.result = parse_result(launch.stdout.get(0, ""))
    return launch


def _lost_its_peer(attempt: Attempt, rank: int) -> bool:
    """Did this rank fail only because a peer had gone (a closed connection)? torchrun names it when it exited on
    its own before the agent looked, with its error file's timestamp in the same whole second as the killed rank."""
    message = attempt.errors.get(rank, {}).get("message", {})
    text = message.get("message", "") if isinstance(message, dict) else ""
    if not text:
        lines = [line for line in attempt.stderr.get(rank, "").splitlines() if line.strip()]
        text = lines[-1] if lines else ""
    return bool(PEER_FAILURE.search(text))


def _first_to_end(attempt: Attempt, named: int, worker_pids: dict, stopped_by_agent: set[int]) -> str | None:
    """torchrun named a rank it had stopped itself, or one that only lost its peer (its error file's timestamp won
    a tie of whole seconds; see processes.WorkerPids). The rank that ended first is one the agent did not have to
    stop, that wrote no error file and printed no traceback: nothing a Python process can catch or report ended it,
    which is SIGKILL's mark."""
    ended_alone = sorted(rank for pid, (number, rank) in worker_pids.items()
                         if number == attempt.number and rank != named and pid not in stopped_by_agent
                         and rank not in attempt.errors)
    for rank in ended_alone:
        stderr = attempt.stderr.get(rank, "")
        if "Traceback (most recent call last)" not in stderr and "Fatal Python error" not in stderr:
            return describe_exit(rank, -signal.SIGKILL)
    return None


def describe_exit(rank: int, code: int) -> str:
    if code == -signal.SIGTERM:
        return f"rank {rank} stopped by torchrun"
    if code < 0:
        return f"rank {rank} killed by {signal.Signals(-code).name}"
    return f"rank {rank} exit code {code}"


def read(path: Path) -> str:
    try:  # bytes, not read_text(): universal newlines would turn tqdm's "\r" redraws into lines
        return path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def parse_result(text: str) -> dict | None:
    """The JSON of the last `RESULT {...}` line in a script's output, or None. A line that starts the same way and
    holds no JSON object is the script's own business (a learner's log line), not a result: it is passed over."""
    for line in reversed(text.splitlines()):
        if line.startswith(RESULT_PREFIX):
            try:
                value = json.loads(line[len(RESULT_PREFIX):])
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


def as_terminal_shows(text: str) -> str:
    """Collapse carriage-return redraws (tqdm bars) to what a terminal finally shows."""
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))


def print_ranks(launch: LaunchResult, label: str = "rank{rank}", heading: str = "") -> None:
    """Each rank's output, rank by rank, each line labelled: the same every run.
    After a restart, each attempt under a heading of its own. ``label`` names a rank (local rank on a node)."""
    attempts = launch.attempts or [Attempt(0, launch.stdout, launch.stderr)]
    for attempt in attempts:
        if len(attempts) > 1:
            how = f"ended: {attempt.failure}" if attempt.failure else (
                "succeeded" if launch.returncode == 0 else "failed")
            sys.stdout.write(f"--- {heading}attempt {attempt.number} ({how}) ---\n")
            sys.stdout.flush()
        for rank in sorted(set(attempt.stdout) | set(attempt.stderr)):
            for text, stream in ((attempt.stdout.get(rank, ""), sys.stdout), (attempt.stderr.get(rank, ""), sys.stderr)):
                text = as_terminal_shows(text).rstrip("\n")
                if text:
                    name = label.format(rank=rank)
                    stream.write("".join(f"[{name}] {line}\n" for line in text.split("\n")))
                    stream.flush()  # keep stdout and stderr blocks in rank order
