"""Lesson 09's accumulation check at the sizes its notebook doesn't launch (it runs 2 ranks, k = 4), and bad input."""
import sys

import pytest

import lessons
from conftest import SCRIPTS


@pytest.mark.parametrize("nproc, k", [(2, 1), (2, 2), (4, 1), (4, 2), (4, 4)])
def test_accumulation_matches_one_big_batch_with_one_all_reduce_per_step(nproc, k, launch_env):
    result = lessons.torchrun(SCRIPTS / "grad_accumulation.py", nproc=nproc, env=launch_env, show=False,
                              args=["--accum-steps", k, "--steps", 2, "--modes", "no_sync,every,all_no_sync"]).result
    assert result["world_size"] == nproc and result["global_batch"] == nproc * k * 8
    assert result["matches_big_batch"] and result["params_agree_across_ranks"]
    assert result["allreduces_per_step_with_no_sync"] == 1
    assert result["allreduces_per_step_without_no_sync"] == k
    assert result["modes"]["all_no_sync"]["allreduces_per_step"] == 0
    assert result["modes"]["all_no_sync"]["params_spread_across_ranks"] > 0  # the post's loop drifts


@pytest.mark.parametrize("args, message", [
    (["--accum-steps", "0"], "--accum-steps must be >= 1 (the micro-batches per optimizer step), got 0"),
    (["--modes", "no_sync,sometimes"], "--micro-batch and --steps must be >= 1, --modes a comma-separated subset of"),
])
def test_bad_input_is_one_line(args, message, monkeypatch):
    sys.path.insert(0, str(SCRIPTS))
    import grad_accumulation

    monkeypatch.setattr(sys, "argv", ["grad_accumulation.py", *args])
    with pytest.raises(SystemExit) as stopped:
        grad_accumulation.main()
    assert str(stopped.value).startswith(message) and "\n" not in str(stopped.value)
