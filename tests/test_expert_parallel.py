"""Lesson 15d's expert-parallel MoE layer at sizes a lesson would not use: 37 tokens a rank, capacity factor 1.0
(tokens drop), at 2 ranks (6 experts, top-3), 3 ranks (6 experts, top-2) and 4 ranks (2 copies of 4 experts, expert 0
skewed).

Each launch checks, against the same layer in one process, the outputs, the router's and experts' gradients, one
SGD step, and which (token, expert) pairs were dropped, as the experts received them.
"""
import os
import subprocess
import sys

import lessons
from conftest import SCRIPTS

SIZES = ["--tokens", 37, "--capacity-factor", 1.0]


def expert_parallel(nproc, *args, env):
    return lessons.torchrun(SCRIPTS / "expert_parallel.py", nproc=nproc, args=[*SIZES, *args], show=False,
                            env=env).result


def dropped_as_one_process(result):
    assert result["matches_single_process"] and result["same_tokens_dropped"] and result["step_matches"], result
    assert result["dropped_tokens"] == result["dropped_tokens_single_process"] > 0, result
    assert result["max_output_diff"] < 1e-5 and result["max_grad_diff"] < 1e-5, result
    assert sum(result["tokens_per_expert"]) == result["assignments"] - result["dropped_tokens"], result
    assert max(result["tokens_per_expert"]) <= result["capacity"] * result["world_size"], result
    assert result["rows_sent_off_rank"] > 0 and not result["expert_step_matches_if_divided_by_copies"], result


def test_two_ranks_six_experts_top_3(launch_env):
    result = expert_parallel(2, "--experts", 6, "--top-k", 3, env=launch_env)
    dropped_as_one_process(result)
    assert (result["capacity"], result["assignments"]) == (19, 2 * 37 * 3), result
    assert result["experts_of_rank"] == [[0, 1, 2], [3, 4, 5]], result


def test_three_ranks_six_experts(launch_env):
    result = expert_parallel(3, "--experts", 6, "--top-k", 2, env=launch_env)
    dropped_as_one_process(result)
    assert result["experts_of_rank"] == [[0, 1], [2, 3], [4, 5]], result
    assert result["grads_averaged_over"] == {"router": [0, 1, 2], "experts 0-1": [0], "experts 2-3": [1],
                                             "experts 4-5": [2]}, result


def test_four_ranks_two_copies_of_the_experts_one_expert_skewed(launch_env):
    """2 data-parallel x 2 expert-parallel (so expert parallelism on groups of 2 ranks): the router averaged over all
    4 ranks, an expert over its 2 copies. Expert 0 skewed: it drops more, and balances worse, than the same tokens
    and router without the skew (the control, from the same launch)."""
    result = expert_parallel(4, "--experts", 4, "--top-k", 2, "--dp", 2, "--skew", 3, env=launch_env)
    dropped_as_one_process(result)
    assert (result["dp"], result["ep"], result["capacity"]) == (2, 2, 19), result
    assert result["experts_of_rank"] == [[0, 1], [2, 3], [0, 1], [2, 3]], result
    assert result["grads_averaged_over"] == {"router": [0, 1, 2, 3], "experts 0-1": [0, 2], "experts 2-3": [1, 3]}
    assert result["routed_per_expert"][0] == 4 * 37, result  # every token chose expert 0 among its two
    assert result["tokens_per_expert"][0] == 4 * 19, result  # and expert 0 took its capacity from each rank
    control = result["without_skew"]
    assert result["dropped_tokens"] > control["dropped_tokens"], result
    assert result["load_balancing_loss"] > control["load_balancing_loss"] + 0.3, result


def test_experts_that_do_not_split_evenly_are_refused_in_one_line():
    """Read before the process group forms: no launch, a plain python with the world torchrun would give."""
    done = subprocess.run([sys.executable, str(SCRIPTS / "expert_parallel.py"), "--experts", "4"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "WORLD_SIZE": "3"})
    assert done.returncode == 2, done
    assert done.stderr.splitlines()[-1].endswith(
        "error: --experts 4 must be a multiple of the 3 expert-parallel ranks (3 ranks / --dp 1)"), done.stderr
