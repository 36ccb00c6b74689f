"""Every lesson script under torchrun, and the teardown fix they share."""
import pytest

import lessons
from conftest import SCRIPTS


@pytest.mark.parametrize("nproc", [1, 2, 4])
def test_hello_dist_all_reduce(nproc, launch_env):
    run = lessons.torchrun(SCRIPTS / "hello_dist.py", nproc=nproc, env=launch_env, show=False)
    assert run.result["world_size"] == nproc
    assert run.result["all_reduce_sum"] == nproc * (nproc + 1) / 2
    assert run.result["correct"] is True
    for rank in range(nproc):
        assert f"rank {rank} of {nproc} | local rank {rank} | backend gloo | device cpu" in run.outputs[rank]


def test_ddp_minimal_ranks_end_with_identical_weights(launch_env):
    run = lessons.torchrun(SCRIPTS / "ddp_minimal.py", nproc=2, args=["--steps", 3], env=launch_env, show=False)
    assert run.result == {"world_size": 2, "steps": 3, "params_agree": True}


@pytest.mark.parametrize("fixed", [True, False], ids=["with-fix", "without-fix-control"])
def test_process_group_is_gone_before_python_exits(fixed, launch_env):
    """The teardown fix in ddp_common.py: after main() returns and garbage is collected, gloo's
    worker threads are joined. The control (no fix) shows they would outlive destroy_process_group."""
    args = [] if fixed else ["--without-fix"]
    run = lessons.torchrun(SCRIPTS / "teardown_probe.py", nproc=2, args=args, env=launch_env, show=False)
    if fixed:
        assert run.result == {"fix": True, "gloo_threads_alive": 0}
    else:  # the group is pinned: its worker threads would run into interpreter shutdown
        assert run.result["gloo_threads_alive"] > 0
