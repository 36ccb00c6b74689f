"""Lesson scripts under torchrun at sizes the notebooks don't launch (the notebooks run 2 and 3 ranks)."""
import lessons
from conftest import SCRIPTS


def test_hello_dist_on_one_rank(launch_env):
    run = lessons.torchrun(SCRIPTS / "hello_dist.py", nproc=1, env=launch_env, show=False)
    assert run.result == {"world_size": 1, "backend": "gloo", "all_reduce_sum": 1.0, "correct": True}
    assert "rank 0 of 1 | local rank 0 | backend gloo | device cpu" in run.outputs[0]


def test_digits_ddp_on_four_ranks_trains_the_one_process_model(launch_env, tmp_path):
    """Lesson 00 checks 2 ranks x 32 against 1 process x 64; the same must hold on 4 ranks x 16."""
    import torch

    lessons.torchrun(SCRIPTS / "digits_ddp.py", nproc=4, args=["--epochs", 1, "--save", tmp_path / "ddp.pt"],
                     env=launch_env, show=False)
    lessons.run_python(SCRIPTS / "digits_single.py", args=["--epochs", 1, "--save", tmp_path / "single.pt"],
                       env=launch_env, show=False)
    ddp, single = (torch.load(tmp_path / name, weights_only=True) for name in ("ddp.pt", "single.pt"))
    assert max((ddp[k] - single[k]).abs().max().item() for k in ddp) < 1e-5
