"""Lessons 11 and 11b: launch a script that must fail, read what each rank said, and print checks as small tables.

Kept out of the notebooks so that they open with a hang, not with regular expressions."""
from __future__ import annotations

import re

from .tools.failure import LaunchError
from .tools.launch import torchrun


def failed(script, **kwargs) -> LaunchError:
    """Launch a script that must fail, and return its LaunchError (a launch that succeeds is a surprise)."""
    try:
        torchrun(script, show=False, **kwargs)
    except LaunchError as error:
        return error
    raise AssertionError(f"{script} was expected to fail, and it did not")


def lines_with(error: LaunchError, *words: str) -> None:
    """Print each rank's lines that mention one of the words, once each, without prefixes or torch's source paths."""
    for rank, text in error.result.outputs.items():
        seen = set()
        for line in text.splitlines():
            line = re.sub(r"^(\[rank\d\]:\s*|rank \d: )", "", line)  # torch's prefix, or the script's
            line = re.sub(r"\[/__w/pytorch/[^\]]*\] ", "", line)
            timestamped = re.match(r"\[[EWI]\d{4} ", line)  # torch's log lines: the same message, with a time
            if any(word in line for word in words) and line not in seen and not timestamped:
                seen.add(line)
                print(f"[rank{rank}] {line[:200]}")


def flight_records(launch_error: LaunchError) -> dict[int, list[tuple[str, str]]]:
    """Each rank's Flight Recorder entries, as skipped_collective.py --flight-recorder prints them:
    {rank: [(collective, input sizes), ...]} in the order the rank issued them."""
    return {rank: re.findall(r"flight recorder: #\d+ (\S+) sizes (.*)", text)
            for rank, text in launch_error.result.outputs.items()}


def first_difference(records: dict[int, list]) -> int:
    """How many entries, from the first, are the same on every rank (the index of the first that differs)."""
    lanes = list(records.values())
    same = 0
    while same < min(map(len, lanes)) and all(lane[same] == lanes[0][same] for lane in lanes):
        same += 1
    return same


def fingerprints(error: LaunchError, case: str | None = None) -> list[tuple[str, str, str]]:
    """What each rank was running, from TORCH_DISTRIBUTED_DEBUG=DETAIL's message: (rank, op, shape).
    With `case`, from the message a script printed as "rank N: CASE: RuntimeError: ..." (several cases in one run)."""
    message = next(line for text in error.result.outputs.values() for line in text.splitlines()
                   if "Detected mismatch" in line and (case is None or f": {case}: " in line))
    return re.findall(r"(Rank \d) is running collective: CollectiveFingerPrint\(SequenceNumber=\d+, "
                      r"OpType=(\w+), TensorShape=(\[[\d, ]*\])", message)


def checks(title: str, rows: list[tuple[str, str, bool, str]]) -> None:
    """Print one idea's evidence, a line a claim: what was seen, and beside it the other case it is set against.

    Each row is (what, measured, holds, control): ``holds`` is computed by the caller from the run's own data; a
    line whose claim does not hold starts with FAILS instead of the check mark."""
    print(title)
    for what, measured, holds, control in rows:
        print(f"  {'✓' if holds else 'FAILS'} {what}: {measured} (against: {control})")
