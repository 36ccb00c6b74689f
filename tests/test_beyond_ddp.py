"""Lessons 15's and 15b's scripts at sizes the notebooks don't run: HSDP on a 1 x 2 mesh, tensor parallelism on 4
ranks, torch's GPipe at 8 micro-batches.

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


def test_pipeline_cases_the_lesson_does_not_launch(launch_env):
    """Lesson 15b runs naive, GPipe and 1F1B by hand and torch's 1F1B; here torch's GPipe at 2 stages and 32
    micro-batches of a batch of 32 (the lesson's M = 32, which a fixed batch of 8 could not run; its backwards in
    forward order), with the bubble's formula."""
    result = lessons.torchrun(SCRIPTS / "pipeline_parallel.py", nproc=2, show=False, env=launch_env,
                              args=["--schedule", "gpipe", "--microbatches", 32, "--batch", 32,
                                    "--impl", "torch"]).result
    assert result["matches_single_process"] and result["world_size"] == 2, result
    assert abs(result["bubble_fraction"] - 1 / 33) < 1e-9 and result["peak_activations_per_stage"] == [32, 32]
    assert result["timeline"][0] == [f"F{m}" for m in range(32)] + [f"B{m}" for m in range(32)]
