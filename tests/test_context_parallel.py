"""Lesson 15c's context parallelism at sizes the notebook doesn't run: 2, 3 and 4 ranks, a sequence of 37 (or 9) that
no world divides, ring (plain and zigzag) and Ulysses, causal and not, several cases in each launch (--cases).

Each case is checked by the script against one process (the attention's output, dQ, dK, dV, and the weights after an
SGD step); the ring's wrong answers are the exercise's (tests/test_exercises.py). One launch a world size.
"""
import os
import subprocess
import sys

import lessons
from conftest import SCRIPTS


def launch(nproc, seq_len, heads, cases, env):
    result = lessons.torchrun(SCRIPTS / "context_parallel.py", nproc=nproc, show=False, env=env,
                              args=["--seq-len", seq_len, "--heads", heads, "--cases", ",".join(cases)]).result
    assert result["world_size"] == nproc and list(result["cases"]) == cases, result
    wrong = {name: case for name, case in result["cases"].items() if not case["matches_single_process"]}
    assert wrong == {}, wrong
    return result["cases"]


def test_two_ranks_with_a_chunk_of_padding_only(launch_env):
    """9 tokens in 2 x 2 zigzag chunks of 3: the last chunk is all padding, its keys skipped, its queries dropped."""
    cases = launch(2, 9, 6, ["ring+causal+zigzag", "ring+zigzag", "ulysses"], launch_env)
    assert [cases[name]["padded"] for name in cases] == [3, 3, 1]
    assert cases["ring+zigzag"]["block_pairs_per_rank"] == [6, 6]  # 2 x 2 pairs a step, less the padding's 2
    assert cases["ring+causal+zigzag"]["block_pairs_per_rank"] == [4, 5]  # rank 0 holds chunk 3, the padding


def test_three_ranks_causal_work_grows_with_the_rank_and_zigzag_evens_it(launch_env):
    cases = launch(3, 37, 6, ["ring", "ring+causal", "ring+causal+zigzag", "ulysses+causal"], launch_env)
    assert cases["ring"]["block_pairs_per_rank"] == [3, 3, 3]
    assert cases["ring+causal"]["block_pairs_per_rank"] == [1, 2, 3]  # rank r: blocks 0..r
    assert cases["ring+causal+zigzag"]["block_pairs_per_rank"] == [7, 7, 7]  # 2N + 1 each
    assert cases["ulysses+causal"]["block_pairs_per_rank"] is None  # scaled_dot_product_attention's own work


def test_four_ranks_each_save_a_quarter_and_build_a_fraction_of_the_scores(launch_env):
    cases = launch(4, 37, 4, ["ring+causal", "ring+causal+zigzag", "ulysses"], launch_env)
    assert cases["ring+causal"]["block_pairs_per_rank"] == [1, 2, 3, 4]
    assert cases["ring+causal+zigzag"]["block_pairs_per_rank"] == [9, 9, 9, 9]
    assert cases["ring+causal"]["largest_score_block"] == 4 * 10 * 10  # chunks of 10: 1/16 of L x L
    assert cases["ring+causal+zigzag"]["largest_score_block"] == 4 * 5 * 5
    assert cases["ulysses"]["largest_score_block"] is None
    # What a rank saves for the backward: one process's for its 10 of the 40 (padded) tokens, the ring to the byte;
    # Ulysses also keeps its output twice (head-major from the attention, token-major for the projection).
    quarter = {name: case["single_process_saved_bytes"] * 10 / 37 for name, case in cases.items()}
    assert cases["ring+causal"]["saved_bytes_per_rank"] == [quarter["ring+causal"]] * 4, cases["ring+causal"]
    assert cases["ring+causal+zigzag"]["saved_bytes_per_rank"] == [quarter["ring+causal+zigzag"]] * 4
    assert quarter["ulysses"] < max(cases["ulysses"]["saved_bytes_per_rank"]) <= quarter["ulysses"] * 1.25


def test_bad_input_is_refused_in_one_line_before_any_rank_starts():
    """The checks that need no process group, in one plain process: WORLD_SIZE as torchrun would set it."""
    done = subprocess.run([sys.executable, str(SCRIPTS / "context_parallel.py"), "--mode", "ulysses", "--heads", "6"],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "WORLD_SIZE": "4"})
    assert done.returncode == 2, done
    assert done.stderr.splitlines()[-1].endswith("ulysses gives each of the 4 ranks H/N whole heads: --heads 6 is "
                                                 "not a multiple of 4"), done.stderr
