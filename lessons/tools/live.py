"""What the ranks print, read while the launch runs: shown live, and watched for a start line.

torchrun writes each rank's output to its own file. ``RankLines`` reads what is new in those files;
the launcher polls it a few times a second and hands the lines to:

* ``LiveOutput`` (issue: a 2-minute training was a silent cell), which shows them with ``[rankN]`` labels:
  in Jupyter, in one display that is updated in place and emptied when the launch ends, so the cell keeps
  only the deterministic rank-by-rank output printed afterwards (nbval compares that; it ignores updates);
  elsewhere (a terminal, a plain ``python`` caller), as lines on stdout, as they come;
* ``StartLine``, the clock of ``torchrun(timeout_from=...)``: it notes when every rank has printed a line
  containing a given text (or each rank its own), so a planted hang's timeout does not include the time the ranks
  took to start.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

SHOW_LAST_LINES = 30  # the live view in a notebook: the newest lines, like a terminal's screen
UPDATE_EVERY_S = 0.25


def in_jupyter() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


class RankLines:
    """The complete lines each rank has written since the last ``read()``: (attempt, rank, line)."""

    def __init__(self, log_dir: str):
        self.log_dir = Path(log_dir)
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, bytes] = {}

    def read(self) -> list[tuple[str, int, str]]:
        new = []
        for path in sorted(self.log_dir.glob("*/attempt_*/*/std*.log")):
            rank = path.parent.name
            if not rank.isdigit():
                continue
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets.get(path, 0))
                    chunk = f.read()
            except FileNotFoundError:
                continue
            if not chunk:
                continue
            self.offsets[path] = self.offsets.get(path, 0) + len(chunk)
            *complete, rest = (self.partial.pop(path, b"") + chunk).split(b"\n")
            if rest:
                self.partial[path] = rest
            for raw in complete:
                line = raw.decode("utf-8", errors="replace").rsplit("\r", 1)[-1]  # a tqdm redraw: its last state
                new.append((path.parent.parent.name, int(rank), line))
        return new


class LiveOutput:
    def __init__(self, jupyter: bool | None = None):
        self.jupyter = in_jupyter() if jupyter is None else jupyter
        self.lines: list[str] = []
        self.last_update, self.pending = 0.0, False
        self.handle = None
        if self.jupyter:
            from IPython.display import display
            self.handle = display({"text/plain": ""}, raw=True, display_id=True)

    def show(self, lines: list[tuple[str, int, str]]) -> None:
        """Called on every tick of the launch, with the lines that are new (perhaps none)."""
        new = [f"[rank{rank}] {line}" for _, rank, line in lines]
        if self.jupyter:
            self.lines = (self.lines + new)[-SHOW_LAST_LINES:]
            self.pending = self.pending or bool(new)
            # At most every UPDATE_EVERY_S; lines held back meanwhile go out at the next tick after it, even when
            # nothing new comes (a rank's first line 0.1 s after another's would otherwise wait for the next line).
            if self.pending and time.monotonic() - self.last_update > UPDATE_EVERY_S:
                self._show()
        elif new:
            sys.stdout.write("".join(line + "\n" for line in new))
            sys.stdout.flush()

    def _show(self) -> None:
        self.handle.update({"text/plain": "running...\n" + "\n".join(self.lines)}, raw=True)
        self.last_update, self.pending = time.monotonic(), False

    def close(self) -> None:
        """The launch ended: the live view goes; the rank-by-rank output printed next takes its place."""
        if self.handle is not None:
            self.handle.update({"text/plain": ""}, raw=True)


class StartLine:
    """When has every rank of one attempt printed its start line? ``text`` is the line every rank prints, or
    ``{rank: text}``, one per rank, for a clock that starts at an event one rank alone reports. ``at`` is that
    moment (time.monotonic()), or None while some rank has not."""

    def __init__(self, text: str | dict[int, str], nproc: int):
        self.texts = dict(text) if isinstance(text, dict) else dict.fromkeys(range(nproc), text)
        self.nproc = nproc
        self.seen: dict[str, set[int]] = {}  # attempt -> ranks that printed theirs
        self.at: float | None = None

    def see(self, lines: list[tuple[str, int, str]]) -> None:
        for attempt, rank, line in lines:
            if rank in self.texts and self.texts[rank] in line:
                ranks = self.seen.setdefault(attempt, set())
                ranks.add(rank)
                if self.at is None and len(ranks) == self.nproc:
                    self.at = time.monotonic()

    def wanted(self) -> str:
        """The line in words: 'X', or "its start line (rank 0: 'A', ranks 1, 2: 'B')"."""
        by_text: dict[str, list[int]] = {}
        for rank, text in sorted(self.texts.items()):
            by_text.setdefault(text, []).append(rank)
        if len(by_text) == 1:
            return repr(next(iter(by_text)))
        return "its start line (" + ", ".join(
            f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(map(str, ranks))}: {text!r}"
            for text, ranks in by_text.items()) + ")"

    def missing(self) -> list[int]:
        """The ranks that have not printed it (in the attempt that got furthest)."""
        most = max(self.seen.values(), key=len, default=set())
        return [rank for rank in range(self.nproc) if rank not in most]
