"""Lesson 08's hand-made SyncBatchNorm at the sizes its notebook doesn't launch, and its bad input.

The notebook runs 2 ranks with 3,5 and 0,4 samples, and the training comparison."""
import sys

import pytest

import lessons
from conftest import SCRIPTS

CHECKS = ("forward_matches", "input_grad_matches", "param_grad_matches", "running_stats_match")


@pytest.mark.parametrize("nproc, sizes", [(2, "2,2"), (4, "2,2,2,2"), (4, "1,0,3,2")])
def test_hand_made_syncbn_equals_batchnorm_on_the_whole_batch(nproc, sizes, launch_env):
    result = lessons.torchrun(SCRIPTS / "sync_batchnorm.py", nproc=nproc, args=["--batch-sizes", sizes],
                              env=launch_env, show=False).result
    assert result["world_size"] == nproc and result["batch_sizes"] == [int(s) for s in sizes.split(",")]
    assert all(result[check] for check in CHECKS), result["max_diff"]
    assert result["per_rank_bn_matches"] is False  # the control: per-rank statistics are not the batch's
    assert result["allreduces"] == {"forward": 1, "backward": 1}


@pytest.mark.parametrize("sizes, message", [
    ("3,5,2", "--batch-sizes needs one size >= 0 per rank: 2 ranks, got '3,5,2'"),
    ("3,-1", "--batch-sizes needs one size >= 0 per rank: 2 ranks, got '3,-1'"),
    ("3,x", "--batch-sizes must be whole numbers separated by commas, got '3,x'"),
    ("0,0", "--batch-sizes are all 0: BatchNorm needs more than 1 value per channel when training"),
])
def test_bad_batch_sizes_are_one_line(sizes, message, monkeypatch):
    sys.path.insert(0, str(SCRIPTS))
    import sync_batchnorm

    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun would set it; the checks come before any process group
    monkeypatch.setattr(sys, "argv", ["sync_batchnorm.py", "--batch-sizes", sizes])
    with pytest.raises(SystemExit) as stopped:
        sync_batchnorm.main()
    assert str(stopped.value) == message
