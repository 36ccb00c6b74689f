"""Lessons 11 and 11b: the launcher (live output while a launch runs, every rank's stack when it times out) and the
failure catalogue at sizes the notebook does not run."""
import subprocess
import sys
import time

import pytest

import lessons
import lessons.tools.stacks
from conftest import FIXTURES, SCRIPTS


def test_live_output_reaches_a_plain_python_caller_before_the_launch_ends(launch_env, tmp_path):
    seen_both = tmp_path / "seen"  # the ranks work until this file exists
    caller = subprocess.Popen([sys.executable, "-c", (
        "import lessons\n"
        f"lessons.torchrun({str(FIXTURES / 'print_then_wait.py')!r}, nproc=2, timeout=60, env={launch_env!r}, live=True,"
        f" args=[{str(seen_both)!r}])\n"
    )], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        seen = []
        while len(seen) < 2 and time.monotonic() < deadline:  # both ranks' first lines
            line = caller.stdout.readline()
            if "tick from rank" in line:
                seen.append(line.strip())
        still_running = caller.poll() is None  # the ranks wait for the file below
        seen_both.touch()
        rest, _ = caller.communicate(timeout=60)
    finally:
        caller.kill()
    assert sorted(seen) == ["[rank0] tick from rank 0", "[rank1] tick from rank 1"]
    assert still_running, "the lines came only when the launch had ended"
    assert "[rank0] done" in rest and caller.returncode == 0


@pytest.mark.parametrize("nproc, expected", [  # 3 ranks: ranks 0 and 1 as at 2 ranks, and a third place
    (3, {0: "all_reduce \u2190 main (planted_hang.py:14)", 1: "main (planted_hang.py:16): time.sleep(600)",
         2: "recv \u2190 main (planted_hang.py:18)"}),
])
def test_a_timeout_says_where_each_rank_was(nproc, expected, launch_env, monkeypatch):
    monkeypatch.setenv("CLICOLOR_FORCE", "1")  # as in a Jupyter kernel: py-spy would colour its dump
    with pytest.raises(lessons.LaunchError) as error:
        lessons.torchrun(FIXTURES / "planted_hang.py", nproc=nproc, timeout=1, timeout_from="about to hang",
                         env=launch_env, show=False)
    lines = str(error.value).splitlines()
    assert lines[0] == "planted_hang.py timed out 1 s after every rank printed 'about to hang'. Where each rank was:"
    assert lines[1:1 + nproc] == [f"  rank {rank}: {place}" for rank, place in expected.items()]
    assert sorted(error.value.result.stacks) == list(range(nproc))
    assert "Thread" in error.value.result.stacks[0]  # the full dump is kept


@pytest.mark.parametrize("tool, says", [
    (None, "no stacks: py-spy is not installed (pip install py-spy)"),
    ("/bin/false", "py-spy could not dump every rank (it needs ptrace: root, or kernel.yama.ptrace_scope=0): "
                   "rank 0: exit code 1; rank 1: exit code 1"),
])
def test_without_py_spy_the_timeout_says_so_in_one_line_and_still_stops_everything(tool, says, launch_env,
                                                                                 monkeypatch):
    """hang.py: no torch in the ranks; where each rank hangs does not matter when no stack can be had."""
    monkeypatch.setattr(lessons.tools.stacks, "py_spy", lambda: tool)
    with pytest.raises(lessons.LaunchError) as error:
        lessons.torchrun(FIXTURES / "hang.py", nproc=2, timeout=1, timeout_from="hanging now", env=launch_env,
                         show=False)
    lines = str(error.value).splitlines()
    assert lines[1] == f"  {says}" and lines[2].startswith("Stopped torchrun and 2 worker process(es).")
    # launch_env's teardown asserts that no process is left.


# Lesson 11b's failure catalogue, at sizes the notebook does not run. Each launch carries the launch_env
# marker, whose teardown fails on any process left behind.

def test_join_fixes_uneven_inputs_on_3_ranks(launch_env):
    """Ranks with 3, 4 and 5 batches: with Join, equal weights, and the one-process schedule's; with
    throw_on_early_termination=True, every rank raises when rank 0 runs out."""
    run = lessons.torchrun(SCRIPTS / "uneven_inputs.py", nproc=3, args=["--join"], timeout=60, env=launch_env,
                           show=False)
    assert run.result == {
        "batches_per_rank": [3, 4, 5], "weights_equal_on_every_rank": True, "matches_one_process": True,
        # Join's own per forward: "have you joined?" and "sync in backward?"; throwing adds a blocking third
        "join_all_reduces_per_step": {"throw_on_early_termination=True": 3.0, "default": 2.0},
        "thrown_with_throw_on_early_termination": ["Rank 0 exhausted all inputs."] + 2 * [
            "Detected at least one rank that exhausted inputs. Throwing across all ranks."]}


@pytest.mark.parametrize("kwargs, text", [
    ({"port": -1}, "port must be an int from 0 to 65535, got -1"),
    ({"port": "29500"}, "port must be an int from 0 to 65535, got '29500'"),
    ({"port": 0, "nnodes": 2}, "port 0 works only for one node with rendezvous='c10d'"),
    ({"port": 0, "nnodes": 1, "rendezvous": "static"}, "port 0 works only for one node with rendezvous='c10d'"),
])
def test_a_bad_rendezvous_port_is_refused_in_one_line(kwargs, text):
    with pytest.raises(ValueError) as refused:
        lessons.torchrun_nodes(SCRIPTS / "where_am_i.py", show=False, **kwargs)
    assert text in str(refused.value) and "\n" not in str(refused.value)


def test_running_counts_the_script_file_it_is_given_not_a_copy_elsewhere(tmp_path):
    """Lesson 11 lists what runs its scripts; a copy of the same script (a test launching it meanwhile) is not it."""
    sleeper = "import time; time.sleep(60)\n"
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    for folder in (here, elsewhere):
        folder.mkdir()
        (folder / "sleeper.py").write_text(sleeper)
    # Popen returns once the child has exec'd, so its arguments and cwd are already visible.
    procs = [subprocess.Popen([sys.executable, "sleeper.py"], cwd=here),  # relative to its own cwd
             subprocess.Popen([sys.executable, str(elsewhere / "sleeper.py")], cwd=tmp_path)]
    try:
        assert lessons.tools.processes.running(here / "sleeper.py") == [(procs[0].pid, "rank None")]
        assert lessons.tools.processes.running(elsewhere / "sleeper.py") == [(procs[1].pid, "rank None")]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert lessons.tools.processes.running(here / "sleeper.py") == []
