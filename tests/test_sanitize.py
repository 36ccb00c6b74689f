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
])
def test_what_varies_is_hidden(first, second):
    assert sanitize(first) == sanitize(second)


@pytest.mark.parametrize("first, second", [
    ("test accuracy 0.970", "test accuracy 0.966"),
    ("| rank | chunk |", "| rank | chunks |"),  # a table's bars are not a progress bar
    ('RESULT {"samples_per_s": 7837.6, "final_loss": 0.26}', 'RESULT {"samples_per_s": 7837.6, "final_loss": 0.27}'),
    ("epoch 0: 100%|██████| 24/24", "epoch 0: 100%|██████| 23/24"),
    ('"allreduce_launch_ms": [0.2], "launched_during_backward": 6', '"allreduce_launch_ms": [0.2], "launched_during_backward": 0'),
])
def test_what_matters_is_compared(first, second):
    assert sanitize(first) != sanitize(second)
