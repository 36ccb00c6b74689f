"""%%torchrun: run a notebook cell as a DDP script, without rewriting any lesson's file.

    %load_ext lessons
    %%torchrun -n 2 [--timeout S] [--name NAME]
    import torch.distributed as dist
    ...

The cell is written to scratch/NAME.py (git-ignored; NAME defaults to "cell") at the top of the course, and launched
through lessons.torchrun: the same live output, the same errors (a failing rank's traceback), the same clean-up.
The launch's LaunchResult is left in the notebook as ``_torchrun``.
"""
from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

from .launch import torchrun

SCRATCH = Path(__file__).resolve().parent.parent / "scratch"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="%%torchrun", add_help=False)
    parser.add_argument("-n", "--nproc", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300, help="seconds; 0 for none")
    parser.add_argument("--name", default="cell")
    return parser


def torchrun_cell(line: str, cell: str, namespace: dict | None = None):
    try:
        options = _parser().parse_args(shlex.split(line))
    except SystemExit:  # argparse has printed its one line
        raise ValueError(f"usage: %%torchrun -n N [--timeout S] [--name NAME], got: {line!r}") from None
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", options.name):
        raise ValueError(f"--name must be a Python module name (letters, digits, _), got {options.name!r}")
    SCRATCH.mkdir(exist_ok=True)
    script = SCRATCH / f"{options.name}.py"
    script.write_text(cell)
    result = torchrun(script, nproc=options.nproc, timeout=options.timeout or None)
    if namespace is not None:
        namespace["_torchrun"] = result


def load_ipython_extension(ipython):
    def magic(line, cell):
        torchrun_cell(line, cell, ipython.user_ns)

    ipython.register_magic_function(magic, magic_kind="cell", magic_name="torchrun")
