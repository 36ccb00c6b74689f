"""Lesson 09's accumulation check at the sizes its notebook doesn't launch (it runs 2 ranks, k = 4), and bad input."""
import sys

import pytest

import lessons
from conftest import SCRIPTS


@pytest.mark.parametrize("nproc", [3])  # the notebook launches 2 ranks (k = 4); 3: odd, and cheaper than 4
def test_accumulation_matches_one_big_batch_with_one_all_reduce_per_step(nproc, launch_env):
    result = lessons.torchrun(SCRIPTS / "grad_accumulation.py", nproc=nproc, env=launch_env, show=False,
                              args=["--accum-steps", "1,2,4", "--steps", 2,
                                    "--modes", "no_sync,every,all_no_sync,no_sync_fwd,no_sync_bwd"]).result
    assert sorted(result["per_accum_steps"]) == ["1", "2", "4"]
    for k, r in ((int(k), r) for k, r in result["per_accum_steps"].items()):
        assert r["world_size"] == nproc and r["global_batch"] == nproc * k * 8
        assert r["matches_big_batch"] and r["params_agree_across_ranks"], (k, r)
        assert r["allreduces_per_step_with_no_sync"] == 1
        assert r["allreduces_per_step_without_no_sync"] == k
        assert r["modes"]["all_no_sync"]["allreduces_per_step"] == 0
        assert r["modes"]["all_no_sync"]["params_spread_across_ranks"] > 0  # the post's loop drifts
        # The forward decides: only the forward inside no_sync skips the all-reduce; only the backward does not.
        assert r["modes"]["no_sync_fwd"]["allreduces_per_step"] == 1
        assert r["modes"]["no_sync_bwd"]["allreduces_per_step"] == k
        assert all(r["modes"][mode]["grad_diff_from_big_batch"] < 1e-5 for mode in ("no_sync_fwd", "no_sync_bwd"))


@pytest.mark.parametrize("args, message", [
    (["--accum-steps", "0"], "--accum-steps must be >= 1 (the micro-batches per optimizer step), got 0"),
    (["--accum-steps", "two"], "--accum-steps must be whole numbers, got 'two'"),
    (["--modes", "no_sync,sometimes"], "--micro-batch and --steps must be >= 1, --modes a comma-separated subset of"),
])
def test_bad_input_is_one_line(args, message, monkeypatch):
    sys.path.insert(0, str(SCRIPTS))
    import grad_accumulation

    monkeypatch.setattr(sys, "argv", ["grad_accumulation.py", *args])
    with pytest.raises(SystemExit) as stopped:
        grad_accumulation.main()
    assert str(stopped.value).startswith(message) and "\n" not in str(stopped.value)


def test_compression_hooks_bytes_and_what_the_final_losses_can_say(launch_env):
    """compression_hooks.py's reading of powerSGD_hook.py (which tensors it compresses, the sizes of P and Q)
    against the bytes the hook really handed to dist.all_reduce; and lesson 09b's reading of the final losses, which
    its notebook runs at one seed only: the plain all-reduce's own spread over seeds 0-3 is about as large as the
    gaps between plain, fp16 and bf16 (no ranking), while PowerSGD's gap is more than twice as large, and its
    loss above every seed's plain loss."""
    result = lessons.torchrun(SCRIPTS / "compression_hooks.py", nproc=2, env=launch_env, show=False,
                              args=["--plain-seeds", "1,2,3"]).result
    hooks, elements = result["hooks"], result["powersgd_elements"]
    assert elements == {"uncompressed": 236, "P": 236, "Q": 829}  # SmallCNN: 5 biases; 5 weights compressed
    assert hooks["powersgd"]["bytes_per_step"] == 4 * sum(elements.values())
    assert hooks["none"]["bytes_per_step"] == 4 * 62_006 == 2 * hooks["fp16"]["bytes_per_step"]  # all fp32 params

    plain_losses = [hooks["none"]["final_loss"], *result["plain_final_loss_by_seed"].values()]
    seed_spread = max(plain_losses) - min(plain_losses)
    gap = {name: abs(hooks[name]["final_loss"] - hooks["none"]["final_loss"]) for name in ("fp16", "bf16", "powersgd")}
    assert max(gap["fp16"], gap["bf16"]) < 1.5 * seed_spread, (gap, plain_losses)
    assert gap["powersgd"] > 2 * seed_spread and hooks["powersgd"]["final_loss"] > max(plain_losses), (gap, plain_losses)
