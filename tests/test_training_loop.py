"""Lesson 13's check at a size its notebook doesn't launch (it runs 2 ranks): clipping with accumulation at 3 ranks.
Lesson 13b's early stopping is its own launch at 2 ranks, whose checks nbval compares: the agreed stop (--decide all)
stopped together, then rank 0 alone (--decide rank0) hung until the timeout, rank 0 in the all_gather after the loop
and rank 1 in the next step's backward (every rank's stack), and no process left behind."""
import pytest

import lessons
from conftest import SCRIPTS


@pytest.mark.parametrize("nproc", [3])  # the notebook runs 2; 3 is odd, its norms unequal across ranks
def test_clip_after_the_sync_matches_one_process_and_clip_before_it_does_not(nproc, launch_env):
    result = lessons.torchrun(SCRIPTS / "clip_and_accumulate.py", nproc=nproc, env=launch_env, show=False,
                              args=["--accum-steps", 1, 3, "--clip", 0.1]).result
    cases = result["cases"]
    assert [c["accum_steps"] for c in cases] == [1, 3]
    for c in cases:
        assert c["world_size"] == nproc and len(c["grad_norm_per_rank"]) == nproc, c
        assert c["norms_equal"] and c["matches_single_process"], c
        assert c["clipping_active"], c  # else the wrong placement would match too, and prove nothing
        assert not c["clip_before_sync_matches"], c
        assert len(set(c["grad_norm_per_rank_before_sync"])) > 1, c  # each rank clipped by its own norm
    assert {k: result[k] for k in ("norms_equal", "matches_single_process", "clip_before_sync_matches")} == \
        {"norms_equal": True, "matches_single_process": True, "clip_before_sync_matches": False}

