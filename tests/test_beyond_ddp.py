"""Lesson 15's scripts at sizes the notebook doesn't run: HSDP on a 1 x 2 mesh, tensor parallelism on 4 ranks.

The notebook runs HSDP on 2 x 2 and the tensor-parallel MLP on 2 ranks (with its silent wrong plan); the exercise's
check runs a plan at 2 and 4 ranks (tests/test_exercises.py). One launch each.
"""
import lessons
from conftest import SCRIPTS


def test_hsdp_on_one_replica_of_two_shards_trains_ddps_parameters(launch_env):
    result = lessons.torchrun(SCRIPTS / "hsdp.py", nproc=2, args=["--replicate", 1, "--shard", 2, "--steps", 2],
                              show=False, env=launch_env).result
    held = result["param_bytes_per_rank"]
    assert result["matches_ddp"], result
    assert (result["world_size"], held["hsdp"], held["fsdp2"]) == (2, held["ddp"] // 2, held["ddp"] // 2), result


def test_tensor_parallel_on_four_ranks_matches_one_process_with_one_all_reduce(launch_env):
    result = lessons.torchrun(SCRIPTS / "tensor_parallel.py", nproc=4, args=["--hidden", 32], show=False,
                              env=launch_env).result
    assert (result["world_size"], result["matches_single_process"], result["allreduces_per_forward"]) == \
        (4, True, 1), result
    assert result["params_per_rank"] == (16 * 32 + 32) // 4 + 32 * 16 // 4 + 16, result  # 1/4 of each weight
