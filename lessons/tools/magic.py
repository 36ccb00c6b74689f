"""%%torchrun: run a notebook cell as a DDP script, without rewriting any lesson's file.

    %load_ext lessons
    %%torchrun -n 2 [--timeout S] [--name NAME] [-- ARGS]
    import torch.distributed as dist
    ...

The cell is written to scratch/NAME.py (git-ignored; NAME defaults to "cell") at the top of the course, and launched
through lessons.torchrun: the same live output, the same errors (a failing rank's traceback), the same clean-up.
It imports what the lessons' scripts import (ddp_common, train_ddp's data and model: ddp_scripts/ is on its
PYTHONPATH), and ARGS after `--` are its sys.argv[1:]. The launch's LaunchResult is left in the notebook as
``_torchrun``.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
from pathlib import Path

from .launch import torchrun

SCRATCH = Path(__file__).resolve().parents[2] / "scratch"
SCRIPTS = Path(__file__).resolve().parents[2] / "ddp_scripts"  # what a lesson script imports lives here
USAGE = "usage: %%torchrun -n N [--timeout S] [--name NAME] [-- ARGS]"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="%%torchrun", add_help=False)
    parser.add_argument("-n", "--nproc", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300, help="seconds; 0 for none")
    parser.add_argument("--name", default="cell")
    return parser


def torchrun_cell(line: str, cell: str, namespace: dict | None = None):
    words = shlex.split(line)
    own, args = (words[:words.index("--")], words[words.index("--") + 1:]) if "--" in words else (words, [])
    try:
        options = _parser().parse_args(own)
    except SystemExit:  # argparse has printed its one line
        raise ValueError(f"{USAGE}, got: {line!r} (the script's own arguments go after --)") from None
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", options.name):
        raise ValueError(f"--name must be a Python module name (letters, digits, _), got {options.name!r}")
    SCRATCH.mkdir(exist_ok=True)
    script = SCRATCH / f"{options.name}.py"
    script.write_text(cell)
    python_path = os.pathsep.join(p for p in (str(SCRIPTS), os.environ.get("PYTHONPATH", "")) if p)
    result = torchrun(script, nproc=options.nproc, args=args, timeout=options.timeout or None,
                      env={"PYTHONPATH": python_path})
    if namespace is not None:
        namespace["_torchrun"] = result


def load_ipython_extension(ipython):
    def magic(line, cell):
        torchrun_cell(line, cell, ipython.user_ns)

    ipython.register_magic_function(magic, magic_kind="cell", magic_name="torchrun")
