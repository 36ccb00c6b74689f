"""The %%torchrun cell magic (lessons/tools/magic.py): a cell imports what the lessons' scripts import, and takes -- ARGS.
Lesson 14 runs the magic on a plain cell under nbval; this is the one launch that checks the rest."""
import pytest

from conftest import SCRIPTS
from lessons.tools import magic

CELL = """import json
import sys

import torch.distributed as dist

import ddp_common  # a lesson script's import: ddp_scripts/ is on the cell's PYTHONPATH
from train_ddp import SmallCNN  # lesson 04's model

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    print("RESULT " + json.dumps({"args": sys.argv[1:], "params": sum(p.numel() for p in SmallCNN().parameters())}))
dist.destroy_process_group()
"""


def test_a_cell_imports_the_lessons_modules_and_takes_its_arguments(monkeypatch, launch_env):
    monkeypatch.setattr(magic, "SCRIPTS", SCRIPTS)  # under xdist, the snapshot the notebooks don't rewrite
    for name, value in launch_env.items():
        monkeypatch.setenv(name, value)
    namespace = {}
    magic.torchrun_cell("-n 1 --timeout 120 --name magic_test -- --epochs 3 --lr 0.1", CELL, namespace)
    result = namespace["_torchrun"].result
    assert result["args"] == ["--epochs", "3", "--lr", "0.1"] and result["params"] > 0, result


@pytest.mark.parametrize("line", ["-n two", "--epochs 3", "-n 2 --name 3x"])
def test_bad_usage_is_one_line_that_says_where_arguments_go(line):
    with pytest.raises(ValueError, match=r"usage: %%torchrun -n N|--name must be a Python module name"):
        magic.torchrun_cell(line, "print(1)")
