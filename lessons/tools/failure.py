"""Explaining a failed launch: which rank failed first, and its own traceback."""
from __future__ import annotations

import re
import signal
from pathlib import Path

from .rank_output import PEER_FAILURE, LaunchResult, describe_exit

_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?", re.M)  # torch's excepthook labels lines


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


def rank_exit_codes(launcher_log: str) -> dict[int, int]:
    """Exit codes from torchrun's failure summary ("rank : 1 (local_rank: 1)" / "exitcode : -6")."""
    codes = {}
    for block in re.split(r"\n\[\d+\]:\n", launcher_log):
        rank = re.search(r"rank\s*:\s*(\d+)", block)
        code = re.search(r"exitcode\s*:\s*(-?\d+)", block)
        if rank and code:
            codes[int(rank.group(1))] = int(code.group(1))
    return codes


def root_cause_rank(launch: LaunchResult, codes: dict[int, int]) -> int | None:
    """The rank that failed first: one whose own code raised, or one killed by a signal
    (SIGKILL, SIGABRT), rather than one that lost its peer or was stopped by torchrun."""
    with_traceback = [r for r, err in launch.stderr.items() if "Traceback (most recent call last)" in err]
    own_errors = [r for r in with_traceback if not PEER_FAILURE.search(last_exception(launch.stderr[r]))]
    killed = [r for r, c in codes.items() if c < 0 and c != -signal.SIGTERM]
    others = [r for r, c in codes.items() if c != 0 and c != -signal.SIGTERM]
    for candidates in (own_errors, killed, with_traceback, others):
        if candidates:
            return min(candidates)
    return min(codes) if codes else None


def last_exception(stderr: str) -> str:
    """The line that names the error: the exception line of the last traceback, which is the first line of a
    message of several ("RuntimeError: ...", not its closing advice on TORCH_DISTRIBUTED_DEBUG) and comes before
    what the process printed on its way out (a profiler's log line at exit); without a traceback, the last line."""
    text = _RANK_PREFIX.sub("", stderr)
    start = text.rfind("Traceback (most recent call last)")
    if start >= 0:  # the frames are indented; the exception line is the first that is not
        after_frames = (ln for ln in text[start:].splitlines()[1:] if ln.strip() and not ln[0].isspace())
        line = next(after_frames, None)
        if line is not None:
            return line
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def traceback_of(stderr: str) -> str:
    text = _RANK_PREFIX.sub("", stderr)
    start = text.rfind("Traceback (most recent call last)")
    if start < 0:
        return "\n".join(text.rstrip().splitlines()[-15:])
    return text[start:].rstrip()


def recorded_root_cause(launch: LaunchResult) -> tuple[int, str] | None:
    """(rank, traceback) from the error files that ranks decorated with @record wrote, or None.

    torchrun calls the failure with the smallest timestamp the root cause. Its timestamps are whole
    seconds, and a rank that lost its peer often fails in the same second: so, as torch does, earliest
    first, but a rank whose own code raised goes before one that only lost its connection."""
    errors = launch.attempts[-1].errors if launch.attempts else {}
    found = []
    for rank, data in errors.items():
        message = data.get("message", {})
        if not isinstance(message, dict):
            continue
        extra = message.get("extraInfo", {})
        found.append((int(extra.get("timestamp", 0)), bool(PEER_FAILURE.search(message.get("message", ""))),
                      rank, extra.get("py_callstack", message.get("message", "")).rstrip()))
    if not found:
        return None
    own_errors = [f for f in found if not f[1]]
    _, _, rank, traceback = min(own_errors or found)
    return rank, _RANK_PREFIX.sub("", traceback)


def torchrun_root_cause(launcher_log: str) -> dict:
    """The fields of torchrun's own "Root Cause (first observed failure)" block, as it printed them."""
    block = launcher_log.partition("Root Cause (first observed failure):")[2]
    fields = dict(re.findall(r"^\s+(rank|exitcode|error_file|traceback)\s*:\s*(.*)$", block, re.M))
    return fields


def failure(script: Path, launch: LaunchResult) -> LaunchError:
    codes = rank_exit_codes(launch.launcher_log)
    recorded = recorded_root_cause(launch)  # @record's error files, when the script has them
    rank = recorded[0] if recorded else root_cause_rank(launch, codes)  # else read the ranks' stderr
    if rank is None:  # torchrun failed before any rank ran
        tail = "\n".join(launch.launcher_log.rstrip().splitlines()[-20:])
        return LaunchError(f"torchrun failed (exit code {launch.returncode}) before any rank reported:\n{tail}", launch)
    code = codes.get(rank)
    how = f"exit code {code}" if code is not None and code >= 0 else (
        f"signal {signal.Signals(-code).name}" if code is not None else "an error")
    traceback = recorded[1] if recorded else traceback_of(launch.stderr.get(rank, ""))
    where = f" in attempt {launch.attempts[-1].number}" if len(launch.attempts) > 1 else ""
    message = f"rank {rank} of {script.name} failed{where} ({how}):\n{traceback}"
    others = sorted(r for r in codes if r != rank)
    if others:
        message += "\n(other ranks: " + ", ".join(describe_exit(r, codes[r]) for r in others) + ")"
    earlier = [f"attempt {a.number}: {a.failure}" for a in launch.attempts[:-1] if a.failure]
    if earlier:
        message += "\n(earlier attempts ended too: " + "; ".join(earlier) + ")"
    root_cause = last_exception(traceback) if traceback else how
    return LaunchError(message, launch, rank=rank, root_cause=root_cause)
