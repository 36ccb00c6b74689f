"""DDP from scratch (naive, overlap, bucketed) == one big batch == torch's DDP; what torch's DDP adds."""
import pytest

import lessons
from conftest import SCRIPTS


@pytest.mark.parametrize("nproc", [1, 2, 4])
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


def test_ddp_broadcasts_rank_0_weights_at_construction(launch_env):
    run = lessons.torchrun(SCRIPTS / "ddp_features.py", nproc=2, args=["--demo", "broadcast"], env=launch_env,
                           show=False)
    rank0, rank1 = run.result["ranks"]
    assert rank0["before"] != rank1["before"]  # seeded differently on purpose
    assert rank1["after"] == rank0["after"] == rank0["before"]


def test_unused_parameters_fail_without_find_unused_parameters(launch_env):
    with pytest.raises(lessons.LaunchError) as failure:
        lessons.torchrun(SCRIPTS / "ddp_features.py", nproc=2, args=["--demo", "unused"], env=launch_env, show=False)
    assert "Expected to have finished reduction in the prior iteration" in str(failure.value)
    run = lessons.torchrun(SCRIPTS / "ddp_features.py", nproc=2, args=["--demo", "unused", "--find-unused"],
                           env=launch_env, show=False)
    assert run.result["ranks"] == [{"steps": 3}, {"steps": 3}]


def test_gradient_as_bucket_view(launch_env):
    run = lessons.torchrun(SCRIPTS / "ddp_features.py", nproc=2, args=["--demo", "bucket-view"], env=launch_env,
                           show=False)
    assert run.result["ranks"] == [{"grad_is_bucket_view": True, "grad_is_copy_without_flag": True}] * 2


def test_bench_ddp_variants_reports_every_variant(launch_env):
    run = lessons.torchrun(SCRIPTS / "bench_ddp_variants.py", nproc=2, env=launch_env, show=False,
                           args=["--bucket-mb", 25, "--steps", 1, "--warmup", 0])
    rows = run.result["rows"]
    assert [(r["variant"], r["bucket_mb"]) for r in rows] == [
        ("naive", None), ("overlap", None), ("bucketed", 25), ("torch_ddp", 25)]
    assert all(r["step_ms"] > 0 for r in rows)
