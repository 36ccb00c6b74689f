"""Ring all-reduce: the simulation behind the pictures, the from-scratch script, the collectives."""
import pytest

import lessons
from conftest import SCRIPTS
from lessons.plots import fit_alpha_beta
from lessons.ring import chunks_sent_per_rank, ring_stepper, simulate_ring, step_table_html


@pytest.mark.parametrize("n", range(1, 9))
def test_simulated_ring_ends_with_every_chunk_summed_on_every_rank(n):
    steps = simulate_ring(n)
    assert len(steps) == 1 + 2 * (n - 1)
    assert all(chunk == frozenset(range(n)) for rank in steps[-1].state for chunk in rank)
    # After scatter-reduce, rank r holds the finished chunk r+1, and only that one.
    after_scatter = steps[n - 1].state
    for r in range(n):
        finished = [c for c in range(n) if len(after_scatter[r][c]) == n]
        assert finished == [(r + 1) % n]
    assert chunks_sent_per_rank(n) == [2 * (n - 1)] * n  # => 2(N-1)/N * S bytes per rank


def test_bad_ring_sizes_are_refused():
    with pytest.raises(ValueError, match="whole number of ranks"):
        simulate_ring(0)
    with pytest.raises(ValueError, match="step must be between 0 and 6 for N=4"):
        step_table_html(4, 7)


def test_stepper_responds_to_its_controls():
    stepper = ring_stepper(4)
    ranks, step = stepper.children[0].children
    view = stepper.children[1]
    assert "step 0 of 6: start" in view.value
    step.value = 6
    assert "step 6 of 6: all-gather" in view.value
    ranks.value = 3  # fewer ranks: fewer steps, and the step slider follows
    assert step.max == 4 and step.value == 4
    assert "step 4 of 4: all-gather" in view.value and "chunk 3" not in view.value


def test_alpha_beta_fit_recovers_a_known_model():
    rows = [{"impl": "ring", "bytes": b, "seconds": 20e-6 + b / 2e9} for b in (4096, 65536, 1 << 20, 1 << 24)]
    alpha, beta = fit_alpha_beta(rows, "ring")
    assert alpha == pytest.approx(20e-6, rel=1e-6)
    assert 1 / beta == pytest.approx(2e9, rel=1e-6)


@pytest.mark.parametrize("nproc", [1, 3])  # notebook 02b launches 4 and 8 (ring_minimal.py 3); the next test 2
def test_ring_matches_dist_all_reduce(nproc, launch_env):
    numels = [0, 1, 3, 7, 1000, 1001]  # empty, fewer elements than ranks, not divisible by N
    run = lessons.torchrun(SCRIPTS / "ring_allreduce.py", nproc=nproc, env=launch_env, show=False,
                           args=["--numel", *numels, "--dtype", "float32", "float64", "int64"], timeout=600)
    assert run.result["world_size"] == nproc
    assert len(run.result["checks"]) == len(numels) * 3
    for check in run.result["checks"]:
        assert check["matches_builtin"] and check["naive_matches_builtin"], check
        if check["dtype"] == "int64":
            assert check["max_abs_err"] == 0
        size = check["numel"] * {"float32": 4, "float64": 8, "int64": 8}[check["dtype"]]
        ring_sent = check["bytes_per_rank"]["ring"]["sent"]
        element = size // check["numel"] if check["numel"] else 0
        # 2(N-1) chunks of S/N, give or take one element per chunk
        for sent in ring_sent:
            assert abs(sent - 2 * (nproc - 1) * size / nproc) <= 2 * (nproc - 1) * element
        assert check["bytes_per_rank"]["naive"]["sent"][0] == (nproc - 1) * size


def test_ring_script_single_check_has_the_flat_result(launch_env):
    run = lessons.torchrun(SCRIPTS / "ring_allreduce.py", nproc=2, env=launch_env, show=False,
                           args=["--numel", 10, "--dtype", "int64"])
    assert {k: run.result[k] for k in ("world_size", "numel", "dtype", "max_abs_err", "matches_builtin")} == {
        "world_size": 2, "numel": 10, "dtype": "int64", "max_abs_err": 0, "matches_builtin": True}
    # N = 2: each rank sends 2(N-1)/N * S = S (80 bytes); the naive rank 0 sends (N-1) * S = S
    assert run.result["bytes_per_rank"]["ring"]["sent"] == [80, 80]
    assert run.result["bytes_per_rank"]["naive"]["sent"][0] == 80


def test_alpha_beta_fit_weighs_small_messages_as_much_as_large_ones():
    # 10% noise on the 16 MB point alone: a fit on raw seconds would move alpha by milliseconds.
    rows = [{"impl": "ring", "bytes": b, "seconds": (5e-3 + b / 1e9) * (1.1 if b == 1 << 24 else 1)}
            for b in (4096, 65536, 1 << 20, 1 << 24)]
    alpha, _ = fit_alpha_beta(rows, "ring")
    assert alpha == pytest.approx(5e-3, rel=0.05)
