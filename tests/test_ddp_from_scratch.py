"""DDP from scratch at the sizes notebook 03 does not launch (it runs 2 and 3 ranks, and torch's DDP features).

Each launch checks the three variants in turn: one start of torch per world size, not three."""
import pytest

import lessons
from conftest import FIXTURES, SCRIPTS

VARIANTS = ["naive", "overlap", "bucketed"]


# 4 ranks with every parameter in one bucket (offsets into the flat buffer, the division by 4). A bucket per
# parameter runs in the frozen-and-tied launch below (the notebook's default puts several in a bucket).
@pytest.mark.parametrize("nproc, bucket_mb, buckets", [(4, 100, 1)])
def test_every_variant_matches_single_process_and_torch_ddp(nproc, bucket_mb, buckets, launch_env):
    run = lessons.torchrun(SCRIPTS / "ddp_from_scratch.py", nproc=nproc, env=launch_env, show=False,
                           args=["--variant", *VARIANTS, "--bucket-mb", bucket_mb, "--steps", 3])
    results = run.result["variants"]
    assert [r["variant"] for r in results] == VARIANTS
    for r in results:
        assert r["world_size"] == nproc
        assert r["matches_single_process"] is True, r
        assert r["matches_torch_ddp"] is True, r
        assert r["max_abs_diff"] < 1e-5
    assert results[-1]["buckets"] == buckets


def test_frozen_and_tied_parameters_as_torch_handles_them(launch_env):
    """A frozen layer (no gradient: torch's DDP and optimizers skip it) and a tied weight (one parameter used twice):
    the three DDPs from scratch (the bucketed one also with a bucket per parameter) against torch's DDP, ShardedAdamW
    with AdamW's own arguments against one process."""
    result = lessons.torchrun(FIXTURES / "frozen_and_tied.py", nproc=2, env=launch_env, show=False,
                              args=[SCRIPTS]).result
    assert result["frozen_unchanged"] and result["tied"], result
    assert all(diff < 1e-6 for diff in result["max_abs_diff"].values()), result
    assert set(result["max_abs_diff"]) == {"naive", "overlap", "bucketed", "bucket_per_parameter", "sharded_adamw"}
    # A bucket for each parameter that trains (the frozen one has none; the tied weight is one parameter).
    assert result["buckets"]["bucket_per_parameter"] == result["trainable"] > result["buckets"]["bucketed"], result
