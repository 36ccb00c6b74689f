"""The nbval sanitize rules: they must hide what varies from run to run, and nothing else."""
import re

import pytest
from nbval.plugin import get_sanitize_patterns

from conftest import ROOT

PATTERNS = get_sanitize_patterns((ROOT / "tests" / "nbval_sanitize.cfg").read_text())


def sanitize(text):
    for regex, replacement in PATTERNS:
        text = re.sub(regex, replacement, text)
    return text


@pytest.mark.parametrize("first, second", [
    # the same finished tqdm bar at two rates: ncols is fixed, so the bar's width follows the rate text
    ("[rank0] epoch 0: 100%|█████████████████████████████████| 24/24 [00:00<00:00, 116.78it/s]",
     "[rank0] epoch 0: 100%|██████████████████████████████████| 24/24 [00:00<00:00, 99.51it/s]"),
    ("step 12.5 ms", "step 9 ms"),
    ('RESULT {"samples_per_s": 7837.6, "final_loss": 0.26}', 'RESULT {"samples_per_s": 1.2e+04, "final_loss": 0.26}'),
    ("listening on 127.0.0.1:29500", "listening on 127.0.0.1:41234"),
    ("rank 0: file:///tmp/init_7j5fonj_/init -> 3", "rank 0: file:///tmp/init_a1b2c3d4/init -> 3"),
    ('"max_abs_diff": 1e-08, "backward_ms": 0.28, "allreduce_launch_ms": [0.29, 0.83], "launched_during_backward": 0',
     '"max_abs_diff": 1e-08, "backward_ms": 1.5e-01, "allreduce_launch_ms": [], "launched_during_backward": 0'),
    # what another CPU's float kernels change (conftest.py's pins do not cover every CPU): the roundoff-sized
    # difference, a whole float's tail, a parameter digest; the verdict beside each is compared
    ("[rank0] naive, 3 ranks: max |ours - one process| 3e-08, |ours - DDP| 1e-08",
     "[rank0] naive, 3 ranks: max |ours - one process| 1e-08, |ours - DDP| 1e-08"),
    ('"max_abs_diff": 2.9802322387695312e-08, "diff_torch_ddp": 0.0', '"max_abs_diff": 1.4901161193847656e-08, "diff_torch_ddp": 0.0'),
    ('"weight_sums": [55.36177263705031, -0.009971207939088345]', '"weight_sums": [55.361772546159045, -0.009971222374588251]'),
    ("stopped, resumed from its checkpoint            a7406ef11af42d77  True",
     "stopped, resumed from its checkpoint            fadc404192368815  True"),
    ('"params_sha256": "43d7092629c124e665cb8abd7be49ce0a7b34a4bdf409dcf5092f7aea4d56e0a"',
     '"params_sha256": "a49140f007e27f8b83606518b95664c7cb2be21937ad524706be6392d433aa32"'),
    # an exact zero on one CPU is a roundoff on another (lesson 15's tensor-parallel gradients: Intel and AMD)
    ('"matches_single_process": true, "max_grad_diff": 0.0, "allreduces_per_forward": 1',
     '"matches_single_process": true, "max_grad_diff": 2.384185791015625e-07, "allreduces_per_forward": 1'),
    ('"diff_torch_ddp": 0.0, "buckets": 3', '"diff_torch_ddp": 1.4901161193847656e-08, "buckets": 3'),
    ("|ours - DDP| 0e+00", "|ours - DDP| 1e-08"),
    ("FSDP2 trains to DDP's parameters: True (max |diff| 0e+00)", "FSDP2 trains to DDP's parameters: True (max |diff| 3e-08)"),
    ("ring == dist.all_reduce: True (max |diff| 0.0e+00)", "ring == dist.all_reduce: True (max |diff| 5.9e-08)"),
    ("max |diff| 0.0 after 3 steps", "max |diff| 2.3e-07 after 3 steps"),
    # the torch build: the CUDA wheel and the CPU-only one of the same pin, or the next pin
    ("torch 2.14.1+cu130, torchvision 0.29.1+cu130", "torch 2.14.1+cpu, torchvision 0.29.1+cpu"),
    ("torch 2.14.1", "torch 2.15.0"),
    # a loss printed to 4 decimals or more is compared to 3
    ("epoch 1: last batch loss 1.9828", "epoch 1: last batch loss 1.9826"),
    ("epoch losses, 2 ranks x 32:   [2.297946, 2.192202]", "epoch losses, 2 ranks x 32:   [2.297951, 2.192199]"),
])
def test_what_varies_is_hidden(first, second):
    assert sanitize(first) == sanitize(second)


@pytest.mark.parametrize("first, second", [
    ("test accuracy 0.970", "test accuracy 0.966"),
    ("| rank | chunk |", "| rank | chunks |"),  # a table's bars are not a progress bar
    ('RESULT {"samples_per_s": 7837.6, "final_loss": 0.26}', 'RESULT {"samples_per_s": 7837.6, "final_loss": 0.27}'),
    ("epoch 0: 100%|██████| 24/24", "epoch 0: 100%|██████| 23/24"),
    ('"allreduce_launch_ms": [0.2], "launched_during_backward": 6', '"allreduce_launch_ms": [0.2], "launched_during_backward": 0'),
    # what a CPU's last bits do not change: an exact zero, the verdict, a float to its 3rd decimal, a plain number
    ("resumed from its checkpoint            a7406ef11af42d77  True", "resumed from its checkpoint            a7406ef11af42d77  False"),
    ('"final_loss": 1.7345653772354126', '"final_loss": 1.7355653772354126'),
    ("1500 over 375 steps = 4 per step", "1500 over 376 steps = 4 per step"),
    ("max |diff| 4.8e-05", "max |diff| 4.8e-04"),
    # a zero is hidden only where a roundoff could stand: a difference above 1e-5, or a zero that is a value, is not
    ('"max_grad_diff": 0.0, "plan"', '"max_grad_diff": 4.015878200531006, "plan"'),
    ("max |diff| 0.0 after 3 steps", "max |diff| 0.33 after 3 steps"),
    ("FSDP2 trains to DDP's parameters: True (max |diff| 0e+00)", "FSDP2 trains to DDP's parameters: True (max |diff| 4e-02)"),
    ("holds rows [[0.0, 1.0], [4.0, 5.0]]", "holds rows [[1.0, 1.0], [4.0, 5.0]]"),
    ('"lr": 0.0, "step": 3', '"lr": 1e-07, "step": 3'),
    ("epoch 1: last batch loss 1.9828", "epoch 1: last batch loss 1.9728"),
    ("weight[0,0] before DDP -0.0037, after -0.0037", "weight[0,0] before DDP +0.2576, after -0.0037"),
])
def test_what_matters_is_compared(first, second):
    assert sanitize(first) != sanitize(second)


# --- What the committed notebooks hold -----------------------------------------------------------------------------
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def compared_outputs(notebook):
    """(code cell number, text nbval compares) for each cell whose output nbval compares, sanitized."""
    import json
    code = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    for number, cell in enumerate(code):
        if {"nbval-ignore-output", "nbval-skip"} & set(cell["metadata"].get("tags", [])):
            continue
        text = "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                       for o in cell.get("outputs", []))
        yield number, sanitize(text)


def test_no_notebook_holds_execution_timestamps():
    """A re-run must not rewrite every cell's metadata: `make execute` writes none, and none is committed."""
    stamped = [nb.name for nb in NOTEBOOKS if '"iopub.execute_input"' in nb.read_text()]
    assert stamped == [], f"execution timestamps in {stamped}: run python tests/execute_notebooks.py --strip-only"


def test_no_compared_output_names_the_torch_build():
    """The CPU-only build of the pinned torch (2.14.1+cpu) and the next pin pass the same suite."""
    from importlib.metadata import version
    torch_version = version("torch").split("+")[0]
    naming = [f"{nb.name} cell {number}" for nb in NOTEBOOKS for number, text in compared_outputs(nb)
              if torch_version in text or re.search(r"\+cu\d{2,3}\b|\+cpu\b", text)]
    assert naming == []


def test_no_compared_output_holds_an_exact_zero_difference():
    """An exact zero on one CPU is a roundoff on another: a difference compared must read alike either way."""
    zeros = [f"{nb.name} cell {number}: {line.strip()[:80]}" for nb in NOTEBOOKS
             for number, text in compared_outputs(nb) for line in text.splitlines()
             if re.search(r"(diff|error)[^\n]{0,20}?(?<![\w.])0\.0(?![\d.])(?!\d)", line)]
    assert zeros == []
