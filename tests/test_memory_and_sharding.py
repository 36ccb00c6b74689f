"""Lesson 12 beyond its notebook (which runs FSDP2 on 2 and 3 ranks, ZeRO on 2, DCP 2 -> 3): other sizes, a layer
with fewer rows than ranks, and the in-process measurements and arithmetic."""
import pytest
import torch

import lessons
from conftest import FIXTURES, SCRIPTS
from lessons.memory import evaluation_keeps, per_rank_bytes, saved_activation_bytes


def test_fsdp2_on_3_ranks_with_a_layer_of_2_rows(launch_env):
    run = lessons.torchrun(SCRIPTS / "fsdp_vs_ddp.py", nproc=3, args=["--widths", "12,50,50,2"], env=launch_env,
                           show=False)
    r = run.result
    assert r["world_size"] == 3 and r["matches_ddp"], r["max_abs_diff"]
    for what in ("param_bytes", "grad_bytes", "optimizer_bytes"):  # about 1/N of DDP's: whole rows, padding
        assert r[f"ddp_{what}"] / 3 <= r[f"fsdp2_{what}"] < r[f"ddp_{what}"] / 3 * 1.3, what
    assert (r["allgathers_per_step"], r["reduce_scatters_per_step"]) == (6, 3)
    plain, bf16, kept = (r["variants"][name] for name in
                         ("fully_shard", "MixedPrecisionPolicy(bf16, fp32)", "reshard_after_forward=False"))
    # bf16 computes and gathers in bf16 (half the bytes), reduces in fp32, and stores fp32 shards as before
    assert (bf16["output_dtype"], bf16["sharded_param_dtype"]) == ("bfloat16", "float32")
    assert 2 * bf16["allgather_bytes_per_step"] == plain["allgather_bytes_per_step"]
    assert bf16["reduce_scatter_bytes_per_step"] == plain["reduce_scatter_bytes_per_step"]
    assert all(bf16[k] == plain[k] for k in ("param_bytes", "grad_bytes", "optimizer_bytes"))
    assert 0 < bf16["max_abs_diff"] < 0.2  # close to DDP's fp32 training, not equal
    # keeping the gathered parameters from forward to backward: no all-gather in backward
    assert (kept["allgathers_per_step"], kept["reduce_scatters_per_step"]) == (3, 3) and kept["max_abs_diff"] < 1e-5
    note = run.stderr[0].strip().splitlines()[0]
    assert note.startswith("note: a layer has 2 rows for 3 ranks; FSDP2 pads it, so some ranks hold an empty shard")


def test_zero_by_hand_on_3_ranks_pads_the_flat_vector(launch_env):
    r = lessons.torchrun(SCRIPTS / "zero_by_hand.py", nproc=3, env=launch_env, show=False).result
    assert r["matches_zero_redundancy_optimizer"] and r["matches_ddp"], r["max_abs_diff"]
    held = r["optimizer_state_bytes"]
    # 3455 parameters over 3 ranks: shards of 1152, two AdamW moments of 4 bytes, and the step counter.
    assert held["ours"] == 2 * 1152 * 4 + 4
    # stage 1, not 2: at the reduce-scatter every full gradient is held, plus the padded flat copy
    assert r["gradient_bytes_one_copy"] == 3455 * 4
    assert r["gradient_bytes_at_reduce_scatter"] == 3455 * 4 + 3 * 1152 * 4
    assert held["ddp_adamw"] == 2 * 3455 * 4 + 6 * 4  # every tensor's two moments and step, on every rank
    # torch's partitions whole tensors: less than everything, but the 50x50 weight alone is 72% of this model
    assert 0 < held["zero_redundancy_optimizer"] < held["ddp_adamw"]


def test_dcp_saved_on_3_ranks_loads_on_2(tmp_path, launch_env):
    lessons.torchrun(SCRIPTS / "dcp_reshard.py", nproc=3, args=["--save", tmp_path], env=launch_env, show=False)
    r = lessons.torchrun(SCRIPTS / "dcp_reshard.py", nproc=2, args=["--load", tmp_path], env=launch_env,
                         show=False).result
    assert r["loaded_equals_saved"] and r["rows_on_rank0"] == {"0.weight": 25, "1.weight": 25, "2.weight": 3}
    # the optimizer's state came back too: both AdamW moments of each of the 6 parameters
    assert sum(k.startswith("optim.") and k.endswith((".exp_avg", ".exp_avg_sq")) for k in r["tensors_compared"]) == 12


def test_saved_activations_checkpointed_and_per_sample():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh()) for _ in range(3)])
    sizes = {}
    for batch in (1, 8):
        x = torch.randn(batch, 32, requires_grad=True)
        sizes[batch] = [saved_activation_bytes(model, x, checkpointed) for checkpointed in (False, True)]
    plain, ckpt = sizes[8]
    # The input, and each block's Tanh output. A Tanh output is saved twice (by the Tanh, and as the next Linear's
    # input) but is one tensor in memory: counted once (counting references gave 3 * 2 * 8 * 32 * 4).
    assert plain["saved_bytes"] == (1 + 3) * 8 * 32 * 4
    assert ckpt["saved_bytes"] == 3 * 8 * 32 * 4  # each block: its input only
    assert (plain["layer_forwards"], ckpt["layer_forwards"]) == (3, 6)  # recomputed in backward
    assert sizes[8][0]["saved_bytes"] == 8 * sizes[1][0]["saved_bytes"]  # per sample


def test_the_evaluation_leak_and_its_fixes():
    assert evaluation_keeps(20, "none") == 2 * evaluation_keeps(10, "none") > 0
    assert [evaluation_keeps(10, fix) for fix in ("item", "detach", "no_grad", "inference_mode")] == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="unknown fix"):
        evaluation_keeps(1, "empty_cache")


def test_zero_accounting():
    row = per_rank_bytes(1e9, 8, "bf16 + fp32 master, AdamW")
    assert row["DDP"] == 16e9 and row["ZeRO-3 / FSDP"] == 2e9
    assert row["ZeRO-1"] == 4e9 + 12e9 / 8 and row["ZeRO-2"] == 2e9 + 14e9 / 8
    with pytest.raises(ValueError, match="world must be >= 1"):
        per_rank_bytes(1e9, 0, "fp32 AdamW")


def test_ddp_common_frees_a_group_that_a_device_mesh_still_holds_at_exit(launch_env):
    """The dcp_reshard.py SIGABRT ("terminate called without an active exception", 2 in 11 full runs): after
    FSDP2, DTensor's caches keep the DeviceMesh, and the mesh the group, past destroy_process_group() and gc.
    ddp_common's exit hook must free it while the interpreter is whole."""
    run = lessons.run_python(FIXTURES / "mesh_holds_group.py", env=launch_env, show=False)  # one process
    assert run.result == {"alive_after_collect": True, "alive_after_release": False}
