"""The DDP doctor (lessons/doctor.py): each code fires on its planted mistake and is silent on the fix.

tests/scripts/doctor/seven_mistakes.py has all seven mistakes (with --fixed, none: a twin to try by hand). One
launch fires the seven codes; silence on real launches is lesson 14's fixed script (it saves once and loads with
map_location and weights_only=True) and tests/test_template.py's template under the doctor; each code alone, and
the clean record, are checked here on what two ranks record, without a launch.
"""
import json
import os
import subprocess
import sys

import pytest

import lessons
from conftest import FIXTURES, ROOT
from lessons.doctor import CODES, SITE_DIR, examine

SEVEN = FIXTURES / "doctor" / "seven_mistakes.py"


def doctor_command(*args, env=None):
    return subprocess.run([sys.executable, "-m", "lessons", "doctor", *map(str, args)], cwd=ROOT, text=True,
                          capture_output=True, env={**os.environ, **(env or {})}, timeout=200)


def test_every_code_fires_on_its_mistake(tmp_path, launch_env):
    done = doctor_command(SEVEN, "-n", "2", "--", tmp_path / "ckpt.pt", env=launch_env)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":", 1)[0] for line in lines if not line.startswith("the script")] == list(CODES), lines
    text = done.stdout
    assert f"ranks 0, 1 all called torch.save('{tmp_path / 'ckpt.pt'}')" in text  # the path and the ranks
    assert "largest difference 0.5 in weight (rank 1 vs rank 0)" in text  # the parameter and its difference
    assert "part at call #3: rank 0 called all_reduce on a float32 tensor of shape (3,)" in text  # where they part
    assert "rank 1 called all_reduce on a float32 tensor of shape (2,)" in text
    assert "cuda:0" in text  # what a load without map_location costs on GPUs


def test_a_script_that_cannot_run_is_status_2():
    done = doctor_command(ROOT / "no_such_script.py", "-n", "2")
    assert (done.returncode, done.stdout.strip()) == (2, f"the script did not run to the end: no such script: "
                                                         f"{ROOT / 'no_such_script.py'}")
    assert lessons.doctor(SEVEN, nproc=0).status == 2  # bad input: one line, no launch
    assert subprocess.run([sys.executable, "-m", "lessons", "cure"], cwd=ROOT, capture_output=True).returncode == 2


@pytest.mark.parametrize("extra", [{}, {"RANK": "0", "LOCAL_RANK": "0", "LESSONS_DOCTOR_RANK_PID": "1"}])
def test_the_instruments_are_inert_outside_a_rank(tmp_path, extra):
    """torchrun's agent (no RANK) and a process a rank starts (another pid) load sitecustomize and do nothing."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "LESSONS_DOCTOR_RANK_PID")}
    env.update({"PYTHONPATH": str(SITE_DIR), "LESSONS_DOCTOR_DIR": str(tmp_path), **extra})
    done = subprocess.run([sys.executable, "-c", "import sys; print('torch' in sys.modules)"], env=env,
                          capture_output=True, text=True)
    assert (done.returncode, done.stdout, list(tmp_path.iterdir())) == (0, "False\n", [])


def write_events(tmp_path, per_rank):
    for rank, events in per_rank.items():
        (tmp_path / f"rank{rank}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_collectives_differ_in_count_names_the_missing_call(tmp_path):
    """A hang: rank 1 was killed inside call #2, which rank 0 never made. What the ranks wrote as they went."""
    call = {"event": "collective", "op": "all_reduce", "shape": [[4], "float32"]}
    write_events(tmp_path, {0: [call], 1: [call, {**call, "op": "barrier", "shape": None}]})
    [finding] = examine(tmp_path, 2)
    assert finding.code == "collectives-differ"
    assert "part at call #2: rank 0 made no call #2 (1 collectives in all), rank 1 called barrier;" in finding.message
    write_events(tmp_path, {0: [call], 1: [call]})
    assert examine(tmp_path, 2) == []  # the control: the same sequence


def test_set_epoch_with_the_same_value_twice_is_found(tmp_path):
    """set_epoch(0) every epoch is the same mistake as no set_epoch; set_epoch(epoch) is not; nor is shuffle=False."""
    it = {"event": "sampler_iter", "sampler": 1, "shuffle": True}
    write_events(tmp_path, {0: [{**it, "epoch": 0}, {**it, "epoch": 0}], 1: []})
    assert [f.code for f in examine(tmp_path, 2)] == ["no-set-epoch"]
    write_events(tmp_path, {0: [{**it, "epoch": 0}, {**it, "epoch": 1}, {**it, "sampler": 2, "shuffle": False,
                                                                         "epoch": 0},
                                {**it, "sampler": 2, "shuffle": False, "epoch": 0}], 1: []})
    assert examine(tmp_path, 2) == []


def one_mistake(code, tmp_path):
    """What two ranks record for a clean run, with exactly one mistake planted: the doctor's input, no launch."""
    import torch

    it = {"event": "sampler_iter", "sampler": 1, "shuffle": True}
    call = {"event": "collective", "op": "all_reduce", "shape": [[3], "float32"]}
    clean = {rank: [{**it, "epoch": 0}, {**it, "epoch": 1}, call,
                    *([{"event": "save", "path": "ckpt.pt"}] if rank == 0 else []),
                    {"event": "load", "path": "ckpt.pt", "map_location": True, "weights_only": True},
                    {"event": "exit", "initialized": False, "ddp_modules": 1}] for rank in (0, 1)}
    weights = {rank: {"ddp0.weight": torch.ones(2, 2)} for rank in (0, 1)}
    if code == "no-set-epoch":
        clean[0][1]["epoch"] = clean[1][1]["epoch"] = 0
    elif code == "save-on-every-rank":
        clean[1].insert(3, {"event": "save", "path": "ckpt.pt"})
    elif code == "load-without-map-location":
        clean[1][-2]["map_location"] = False
    elif code == "weights-only-off":
        clean[1][-2]["weights_only"] = False
    elif code == "params-diverged":
        weights[1]["ddp0.weight"] = torch.tensor([[1.0, 1.0], [1.0, 1.25]])
    elif code == "collectives-differ":
        clean[1][2] = {**call, "shape": [[2], "float32"]}
    elif code == "no-destroy":
        clean[0][-1]["initialized"] = clean[1][-1]["initialized"] = True
    write_events(tmp_path, clean)
    for rank, tensors in weights.items():
        torch.save(tensors, tmp_path / f"rank{rank}.params.pt")


@pytest.mark.parametrize("code", [None, *CODES])
def test_each_code_fires_on_its_one_mistake_alone(code, tmp_path):
    """The launches above plant all seven at once; here each alone, so no code fires because of another's mistake."""
    one_mistake(code, tmp_path)
    assert [f.code for f in examine(tmp_path, 2)] == ([code] if code else [])
