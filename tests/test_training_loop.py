"""Lessons 13 and 13b's checks at the sizes their notebooks don't launch (they run 2 ranks): clipping with accumulation
(13) at 3 and 4 ranks, and early stopping (13b) at 3 ranks, the hang stopped by the timeout with nothing left behind.
The agreed stop (--decide all) is 13b's own launch, whose stopped_together nbval compares."""
import pytest

import lessons
from conftest import SCRIPTS
from lessons.stacks import where


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


def test_rank0_stopping_alone_hangs_until_the_timeout_which_shows_every_rank(launch_env):
    with pytest.raises(lessons.LaunchError) as stopped:
        lessons.torchrun(SCRIPTS / "early_stop.py", nproc=3, env=launch_env, show=False, args=["--decide", "rank0"],
                         timeout=3, timeout_from={0: "(rank 0 alone)", 1: "started training", 2: "started training"})
    assert ("timed out 3 s after every rank printed its start line (rank 0: '(rank 0 alone)', ranks 1, 2: 'started "
            "training')") in str(stopped.value)
    stacks = stopped.value.result.stacks
    assert sorted(stacks) == [0, 1, 2]
    places = {rank: where(stack, "early_stop.py") for rank, stack in stacks.items()}
    assert places[0].startswith("all_gather"), places  # rank 0 left the loop
    assert all("backward" in places[rank] for rank in (1, 2)), places  # the others wait in DDP's all-reduce
    assert "stopping at step" in stopped.value.result.outputs[0]
    # launch_env's teardown asserts that no process of the launch is left.
