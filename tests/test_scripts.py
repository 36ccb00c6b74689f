"""Lesson scripts under torchrun at sizes the notebooks don't launch (the notebooks run 2 and 3 ranks)."""
import lessons
from conftest import SCRIPTS


def test_hello_dist_on_one_rank(launch_env):
    run = lessons.torchrun(SCRIPTS / "hello_dist.py", nproc=1, env=launch_env, show=False)
    assert run.result == {"world_size": 1, "backend": "gloo", "all_reduce_sum": 1.0, "correct": True}
    assert "rank 0 of 1 | local rank 0 | backend gloo | device cpu" in run.outputs[0]
