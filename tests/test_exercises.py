"""The exercises and their checks (lessons/tools/check.py, lessons/tools/exercise_checks/): on real ranks, under torchrun.

Every solution passes; every starter fails; for each exercise a typical wrong answer (tests/exercise_mistakes/)
fails with the hint that names its mistake; a file that defines nothing, one that hangs and bad usage each get
one clear line. The notebooks' check cells are nbval-skip: these tests are where the checks run.
One launch per number of ranks checks every answer to every exercise (`checked`); `launch_env` fails a test that
leaves a process behind.
"""
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import MARKER

check_module = importlib.import_module("lessons.tools.check")  # the module; `lessons.check` is the function
ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "exercises" / "solutions"
MISTAKES = Path(__file__).resolve().parent / "exercise_mistakes"
NAMES = list(check_module.EXERCISES)


def solution(name):
    return SOLUTIONS / name if name == "find_the_hang" else SOLUTIONS / f"{name}.py"


def verdict(capsys):
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines, "the check printed nothing"
    return lines[0], out


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes(name, checked):
    result = checked(name, solution(name))
    assert result.passed and result.lines[0] == f"PASS {name}", "\n".join(result.lines)


def test_a_learners_check_is_a_launch_of_its_own_with_the_same_verdict(launch_env, checked, monkeypatch, capsys):
    """What a learner runs (python -m lessons check NAME PATH: one launch, exit 0) says what the shared launch says."""
    monkeypatch.setenv(MARKER, launch_env[MARKER])  # main() launches with this process's environment
    status = check_module.main(["unpadded_eval", str(solution("unpadded_eval"))])
    first, out = verdict(capsys)
    assert (status, first) == (0, "PASS unpadded_eval"), out
    assert out.splitlines() == checked("unpadded_eval", solution("unpadded_eval")).lines, out


STARTER_HINTS = {
    "ring_allreduce": "the tensor is unchanged with 2 ranks (length 1)",
    "average_gradients": "no gradient was averaged",
    "convert_to_ddp": "never called dist.init_process_group()",
    "unpadded_eval": "counted twice with 2 ranks and a data set of 1 sample",
    "resume": "rank(s) [0, 1] wrote the checkpoint with 2 ranks: only rank 0 should save",
    "no_sync": "3 all-reduces per step (3 ranks, k = 3): the forward and backward of the first k-1 micro-batches",
    "find_the_hang": "it hangs: no result within 4 s, while checking rank_conditional.py at 3 ranks",
    "tensor_parallel": "plan() raised on rank 0 with 2 ranks: NotImplementedError",
    "pipeline_schedule": "one_f_one_b() raised NotImplementedError: return the list of ('F', m) and ('B', m)",
    "ring_attention": "merge() raised on rank 0 with 2 ranks: NotImplementedError: return (out, lse)",
    "moe_dispatch": "dispatch() raised on rank 0 with 2 ranks: NotImplementedError",
}


@pytest.mark.parametrize("name", NAMES)
def test_starter_fails(name, launch_env, checked, capsys):
    if name == "find_the_hang":  # it hangs: a launch of its own, whose stacks show where each rank was
        result = lessons_check(name, None, launch_env, timeout=4)
        first, out = verdict(capsys)
    else:
        result = checked(name, check_module.default_path(name))
        first, out = result.lines[0], "\n".join(result.lines)
    assert not result.passed and first.startswith(f"FAIL {name}: "), out
    assert STARTER_HINTS[name] in first, out
    if name == "find_the_hang":  # where each rank was, from the stacks: rank 0 alone in the all_reduce
        assert "rank 0: all_reduce \u2190 main (rank_conditional.py:23)" in out, out
        assert "rank 1: barrier \u2190 main (rank_conditional.py:28)" in out, out


MISTAKE_HINTS = [
    ("ring_allreduce", "ring_send_everything.py",
     "rank 0 sent 192 bytes for a tensor of 96 bytes with 3 ranks; a ring sends at most"),
    ("ring_allreduce", "ring_functional_all_reduce.py",
     "ring_all_reduce ran a collective with 2 ranks (gloo:all_reduce of [[1]]), though it called none of"),
    ("average_gradients", "average_gradients_no_division.py", "gradients are 3x too large"),
    ("average_gradients", "average_gradients_frozen_crash.py",
     "average_gradients() raised on rank 0 with 3 ranks: TypeError: Invalid function argument. Expected parameter"
     " `tensor` of type torch.Tensor (a parameter with requires_grad=False has no .grad: skip parameters whose grad"
     " is None)"),
    ("convert_to_ddp", "convert_to_ddp_no_set_epoch.py", "saw epoch 1 in epoch 0's order with 2 ranks"),
    ("unpadded_eval", "unpadded_eval_mean_of_accuracies.py", "an average of per-rank accuracies"),
    ("resume", "resume_no_barrier.py", "read the checkpoint before rank 0 had written it"),
    ("resume", "resume_restarts_the_epoch.py", "stopped at epoch 1 step 2 (8 steps) and resumed, trained 2 batch(es) "
     "twice: the resumed run must start at the checkpoint's epoch and skip the steps it says are done"),
    ("resume", "resume_starts_at_epoch_0.py", "stopped at epoch 1 step 2 (8 steps) and resumed, trained 6 batch(es) "
     "twice: the resumed run must start at the checkpoint's epoch"),
    ("resume", "resume_skips_every_epoch.py", "stopped at epoch 1 step 2 (8 steps) and resumed, skipped the first 2 "
     "steps of every epoch after it too (2 batches never trained): skip steps only in the epoch the checkpoint was"),
    ("resume", "resume_map_location_empty.py", "torch.load(map_location={}) with 2 ranks would put a tensor saved "
     "from cuda:0 on cuda:0, not on this rank's device (cpu)"),
    ("no_sync", "no_sync_loss_not_divided.py", "gradient 3x too large (3 ranks, k = 3)"),
    ("no_sync", "no_sync_divide_by_k_unequal.py", "each micro-batch's mean loss divided by k (3 ranks, micro-batches "
     "of 5 and 3 samples): a sample of the small one then counts 5/3 times as much"),
    ("find_the_hang", "find_the_hang_early_stop_any_rank.py", "early_stop.py finished, but its RESULT is"),
    ("tensor_parallel", "tensor_parallel_sharded_input.py", "gate's input_layouts say the input is S(0), but every "
     "rank is given the whole input"),  # silent: it runs, and only the comparison with one process fails
    # read from the orders before any launch (a second each): each names its mistake
    ("pipeline_schedule", "pipeline_warmup_from_the_wrong_end.py", "the stages deadlock with 2 stages and 4 "
     "micro-batches: stage 0 waits to run B0 for stage 1's B0; stage 1 waits to run F1 for stage 0's F1"),
    ("pipeline_schedule", "pipeline_backward_first.py", "stage 1 runs the backward of micro-batch 0 before its "
     "forward"),
    ("pipeline_schedule", "pipeline_drain_one_short.py", "stage 0 never runs the backward of micro-batch 3"),
    ("pipeline_schedule", "pipeline_gpipe_order.py", "stage 0 holds 4 micro-batches' activations at its peak with 2 "
     "stages and 4 micro-batches; 1F1B holds at most min(microbatches, num_stages - stage) = 2"),
    ("pipeline_schedule", "pipeline_no_warmup.py", "the stages take 16 steps with 2 stages and 4 micro-batches where "
     "1F1B takes 10 (a forward and a backward one step each): the pipeline is idle 0.50 of the time, 1F1B's bubble "
     "(N - 1)/(M + N - 1) = 0.20: no warm-up: the stages never overlap"),
    # right at 2 and 4 stages with 4 micro-batches, the sizes the check once ran alone
    ("pipeline_schedule", "pipeline_warmup_not_capped.py", "stage 0 runs 3 forwards before its first backward with 4 "
     "stages and 2 micro-batches, and there are only 2 micro-batches (it runs the forward of micro-batch 2, which does "
     "not exist): cap the warm-up at the micro-batches there are, min(microbatches, num_stages - 1 - stage) forwards"),
    ("pipeline_schedule", "pipeline_power_of_two_only.py", "the stages deadlock with 3 stages and 4 micro-batches: "
     "stage 0 waits to run B0 for stage 1's B0; stage 1 waits to run F3 for stage 0's F3; stage 2 waits to run F3 for "
     "stage 1's F3, and each of those waits too. A stage must send the next stage every forward it needs before it "
     "waits for a gradient: stage 1 runs 4 forward(s) before its first backward, where 1F1B runs 2: a warm-up of "
     "min(microbatches, num_stages - 1 - stage) = 1"),
    ("ring_attention", "ring_attention_merge_without_rescale.py", "merge() adds the two outputs without rescaling them"),
    ("ring_attention", "ring_attention_diagonal_unmasked.py", "with 2 ranks, 3 tokens a rank, causal: rank 0's output "
     "differs from one process's, and equals attention with the diagonal block unmasked"),
    # not causal, the blocks' order does not matter, and with 2 ranks both neighbours are one: it shows at 3, causal
    ("ring_attention", "ring_attention_wrong_direction.py", "with 3 ranks, 3 tokens a rank, causal: rank 1's output "
     "differs from one process's, though not causal it was right: a block is taken for another rank's. Rank r sends "
     "its block to rank r - 1, so at step s it holds rank (r + s) % N's block"),
    ("moe_dispatch", "moe_dispatch_no_weights.py", "the experts' outputs were added without the router's weights"),
    ("moe_dispatch", "moe_dispatch_send_splits.py", "rank 0 receives with output_split_sizes [7, 3], but the ranks "
     "send it [7, 7] rows, with 2 ranks: a rank cannot know what it will receive from what it sends; exchange the "
     "counts first"),
    ("moe_dispatch", "moe_dispatch_dropped_still_sent.py", "expert 0 on rank 0 received 10 tokens from rank 0, and its "
     "capacity is 7 (2 ranks): a token past its expert's capacity is dropped: not sent"),
]


def mistake_path(name, mistake, folder):
    """A typical wrong answer; for find_the_hang the solutions' folder, with this one script wrong (under FOLDER)."""
    if name != "find_the_hang":
        return MISTAKES / mistake
    path = folder / f"find_the_hang_{mistake[:-3]}"
    if not path.exists():
        shutil.copytree(solution(name), path)
        shutil.copy(MISTAKES / mistake, path / "early_stop.py")
    return path


_VERDICTS = {}  # exercise -> {answer's path: CheckResult}, for the whole module


@pytest.fixture
def checked(launch_env, tmp_path_factory):
    """checked(name, path): the verdict on one answer. The first test that asks checks every answer this file
    checks, of every exercise (the solution, the starter but find_the_hang's, which hangs, and the typical mistakes),
    in one launch per number of ranks (lessons.check.check_exercises: each answer's check in processes forked from the
    same ranks, judged as its own launch would be); the others read its verdicts. A launch's start is most of its
    cost."""
    def verdict_on(name, path):
        if not _VERDICTS:
            folder = tmp_path_factory.getbasetemp() / "answers"
            answers = {n: [solution(n), *([] if n == "find_the_hang" else [check_module.default_path(n)]),
                           *(mistake_path(e, m, folder) for e, m, _ in MISTAKE_HINTS if e == n)] for n in NAMES}
            results = check_module.check_exercises(answers, env=launch_env)
            _VERDICTS.update({n: {str(p): r for p, r in zip(answers[n], results[n])} for n in NAMES})
        return _VERDICTS[name][str(path)]
    return verdict_on


@pytest.mark.parametrize("name, mistake, hint", MISTAKE_HINTS, ids=[m[1][:-3] for m in MISTAKE_HINTS])
def test_typical_mistake_gets_its_hint(name, mistake, hint, checked, tmp_path_factory):
    result = checked(name, mistake_path(name, mistake, tmp_path_factory.getbasetemp() / "answers"))
    first, out = result.lines[0], "\n".join(result.lines)
    assert not result.passed and first.startswith(f"FAIL {name}: "), out
    assert hint in first, out


def test_defines_nothing_through_the_command_line():
    """Found before any launch: the name is missing from the file (what it does is only ever run and measured)."""
    done = subprocess.run([sys.executable, "-m", "lessons", "check", "unpadded_eval",
                           str(MISTAKES / "defines_nothing.py")], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 1, done
    assert done.stdout.splitlines()[0] == ("FAIL unpadded_eval: defines_nothing.py defines no function evaluate: "
                                           "the exercise asks for evaluate()"), done


def test_a_syntax_error_or_a_missing_script_is_one_line(tmp_path, capsys):
    broken = tmp_path / "resume.py"
    broken.write_text("def save_checkpoint(path, ddp_model, optimizer, epoch, step)\n    pass\n")
    assert not check_module.check("resume", broken)
    assert capsys.readouterr().out == "FAIL resume: resume.py has a syntax error at line 1: expected ':'\n"
    (tmp_path / "early_stop.py").write_text("")
    assert not check_module.check("find_the_hang", tmp_path)
    assert capsys.readouterr().out.startswith(f"FAIL find_the_hang: {tmp_path} has no rank_conditional.py, "
                                              "shape_mismatch.py: the check runs your fixed copies")


@pytest.mark.parametrize("argv, message", [
    ([], "usage: python -m lessons check NAME [PATH]"),
    (["no_such_exercise"], "error: unknown exercise 'no_such_exercise': one of ring_allreduce, "),
    (["ring_allreduce", "no/such/file.py"], "error: no such file: no/such/file.py"),
    (["find_the_hang", "exercises/find_the_hang/early_stop.py"], "error: find_the_hang checks a folder"),
    (["resume", "a.py", "b.py"], "usage: python -m lessons check NAME [PATH]"),
])
def test_bad_usage_exits_2(argv, message, capsys):
    assert check_module.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message), err


def test_the_usage_names_each_exercise_with_its_lesson(capsys):
    """It listed pipeline_schedule under lesson 15 (the first two characters of 15b's name)."""
    check_module.main([])
    listed = capsys.readouterr().err
    for name, exercise in check_module.EXERCISES.items():
        assert f"{name:<18} lesson {exercise.lesson.split('_')[0]}: " in listed, listed
    assert "pipeline_schedule  lesson 15b:" in listed


def test_bad_usage_from_a_cell_is_one_clear_error():
    with pytest.raises(ValueError, match=r"^unknown exercise 'ring': one of ring_allreduce"):
        check_module.check("ring")


def test_the_command_line_exits_2():
    done = subprocess.run([sys.executable, "-m", "lessons", "check", "nope"], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert (done.returncode, done.stdout) == (2, ""), done
    assert done.stderr.startswith("error: unknown exercise 'nope'"), done.stderr  # and no runpy warning before it


def lessons_check(name, path, launch_env, timeout=None):
    return check_module.check(name, path, env=launch_env, timeout=timeout)


def test_a_tensor_parallel_plan_is_read_before_it_is_run():
    """The check names a mistake from the plan itself. The launches above run the silent one (an input declared
    split: it runs, and only the comparison fails); the others are named from the plan, without a launch: the
    styles swapped (its run fails on a shape, and the check then gives this hint), a Linear left out."""
    import importlib.util

    sys.path.insert(0, str(ROOT / "lessons" / "tools" / "exercise_checks"))
    try:
        from tensor_parallel import plan_mistake
    finally:
        sys.path.pop(0)
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    spec = importlib.util.spec_from_file_location("rowwise_first", MISTAKES / "tensor_parallel_rowwise_first.py")
    rowwise_first = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rowwise_first)
    assert plan_mistake(rowwise_first.plan(None)).startswith(
        "the styles are in the wrong order or kind (gate is RowwiseParallel, up is RowwiseParallel, down is "
        "ColwiseParallel)")
    assert plan_mistake({"gate": ColwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()}) is None
    assert plan_mistake({"up": ColwiseParallel(), "down": RowwiseParallel()}).startswith(
        "gate is not in the plan: a Linear left whole meets the others' slices")
    assert plan_mistake([ColwiseParallel()]).startswith("plan(block) must return a dict")
