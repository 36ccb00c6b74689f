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
    ("|ours - DDP| 0e+00", "|ours - DDP| 1e-08"),
    ("resumed from its checkpoint            a7406ef11af42d77  True", "resumed from its checkpoint            a7406ef11af42d77  False"),
    ('"final_loss": 1.7345653772354126', '"final_loss": 1.7355653772354126'),
    ("1500 over 375 steps = 4 per step", "1500 over 376 steps = 4 per step"),
    ("max |diff| 4.8e-05", "max |diff| 4.8e-04"),
])
def test_what_matters_is_compared(first, second):
    assert sanitize(first) != sanitize(second)
