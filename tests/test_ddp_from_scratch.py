"""DDP from scratch at the sizes notebook 03 does not launch (it runs 2 ranks, and torch's DDP features)."""
import pytest

import lessons
from conftest import SCRIPTS


@pytest.mark.parametrize("nproc", [1, 4])
@pytest.mark.parametrize("variant", ["naive", "overlap", "bucketed"])
def test_variant_matches_single_process_and_torch_ddp(variant, nproc, launch_env):
    run = lessons.torchrun(SCRIPTS / "ddp_from_scratch.py", nproc=nproc, args=["--variant", variant, "--steps", 3],
                           env=launch_env, show=False)
    assert run.result["world_size"] == nproc
    assert run.result["matches_single_process"] is True
    assert run.result["matches_torch_ddp"] is True
    assert run.result["max_abs_diff"] < 1e-5


@pytest.mark.parametrize("bucket_mb, buckets", [(100, 1), (0.000001, 6)])  # one bucket; one per parameter
def test_bucketed_with_one_bucket_and_with_a_bucket_per_parameter(bucket_mb, buckets, launch_env):
    run = lessons.torchrun(SCRIPTS / "ddp_from_scratch.py", nproc=2, env=launch_env, show=False,
                           args=["--variant", "bucketed", "--bucket-mb", bucket_mb, "--steps", 3])
    assert run.result["buckets"] == buckets
    assert run.result["matches_single_process"] and run.result["matches_torch_ddp"]
