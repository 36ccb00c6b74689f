"""The --profile instruments never change the run they watch (lessons/tools/doctor_profile_site/sitecustomize.py):
torch is the script's to import, its own profiler has the process to itself, every optimizer that steps is followed,
and a crash is summed up by the script's own error. The site is tried in one process without torchrun (RANK,
LOCAL_RANK and LESSONS_DOCTOR_DIR set, as torchrun and the doctor set them); the crash summary on ranks' recorded
output, then in one real launch."""
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from lessons.tools.doctor import PROFILE_SITE_DIR, _why_it_stopped, doctor
from lessons.tools.failure import failure, last_exception
from lessons.tools.rank_output import Attempt, LaunchResult


def run_under_the_instruments(tmp_path, script, *args, folder=".", cwd="."):
    """SCRIPT, written to TMP_PATH/FOLDER/script.py, run from TMP_PATH/CWD as rank 0 with the instruments loaded by
    Python, as the doctor loads them: its stdout, and the rank's steps.json."""
    for name in (folder, cwd):
        (tmp_path / name).mkdir(exist_ok=True)
    (tmp_path / folder / "script.py").write_text(textwrap.dedent(script))
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "LESSONS_DOCTOR_RANK_PID")}
    env.update(RANK="0", LOCAL_RANK="0", LESSONS_DOCTOR_DIR=str(tmp_path), PYTHONPATH=str(PROFILE_SITE_DIR))
    path = os.path.relpath(tmp_path / folder / "script.py", tmp_path / cwd)
    done = subprocess.run([sys.executable, path, *args], cwd=tmp_path / cwd, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr  # SIGSEGV is -11
    assert not (tmp_path / "rank0.error").exists(), (tmp_path / "rank0.error").read_text()
    return done.stdout, json.loads((tmp_path / "rank0.steps.json").read_text())


def test_torch_is_the_scripts_to_import_and_a_recreated_optimizer_is_followed(tmp_path):
    """torch reads OMP_NUM_THREADS when it is imported: a script that sets it first gets its threads (1 here, which
    any machine grants; the old instruments imported torch first and gave every core). The optimizer re-created
    every 6 steps is one training: its 12 steps are the 10 --profile needs (the old ones counted the first 6)."""
    stdout, steps = run_under_the_instruments(tmp_path, """
        import os, sys, time
        print("torch imported before the script:", "torch" in sys.modules)
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch
        print("threads:", torch.get_num_threads())
        model = torch.nn.Linear(8, 8)
        for step in range(12):
            if step % 6 == 0:
                optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            model(torch.randn(4, 8)).sum().backward()
            time.sleep(0.02)  # where the recorded steps go
            optimizer.step()
            optimizer.zero_grad()
    """, folder="ddp_scripts", cwd="notebooks")  # as a notebook starts ../ddp_scripts/X.py: frames keep the ".."
    assert stdout.splitlines() == ["torch imported before the script: False", "threads: 1"]
    # the sampled lines name the script (started through "..") at its sleep, about 20 ms a recorded step
    source = (tmp_path / "ddp_scripts" / "script.py").read_text().splitlines()
    sleep_line = next(i for i, line in enumerate(source, 1) if "time.sleep" in line)
    assert max(steps["lines_ms"], key=steps["lines_ms"].get) == f"script.py:{sleep_line} in <module>", steps
    assert steps["lines_ms"][f"script.py:{sleep_line} in <module>"] / steps["sampled_steps"] > 10
    assert (len(steps["stamps"]), steps["error"]) == (10, None)
    trace = json.loads((tmp_path / "rank0.json").read_text())
    assert trace["threads_and_cores"]["threads"] == 1  # the profile saw the script's threads too


@pytest.mark.parametrize("wait, active, steps_seen, stepped_back", [
    (0, 2, 10, False),  # theirs ends after step 3, before ours starts after step 4: both profile, one after the other
    (0, 8, 4, True),  # theirs still runs when ours would start
    (5, 2, 5, True),  # theirs starts while ours runs: ours stops first
], ids=["theirs ends before ours starts", "theirs runs when ours would start", "theirs starts while ours runs"])
def test_the_scripts_own_profiler_is_never_run_beside_ours(tmp_path, wait, active, steps_seen, stepped_back):
    """Two profilers at once crash the process (SIGSEGV in both cases, before this fix): ours steps back, and says
    why; the script's own trace is exported. A profiler of the script's that is over before ours starts is the
    control: then both profile."""
    _, steps = run_under_the_instruments(tmp_path, """
        import sys, torch
        model = torch.nn.Linear(8, 8)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        schedule = torch.profiler.schedule(wait=int(sys.argv[1]), warmup=1, active=int(sys.argv[2]), repeat=1)
        with torch.profiler.profile(schedule=schedule, on_trace_ready=lambda p: p.export_chrome_trace("own.json")) as p:
            for step in range(12):
                model(torch.randn(4, 8)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
                p.step()
    """, str(wait), str(active))
    assert (tmp_path / "own.json").exists() and (tmp_path / "rank0.json").exists() != stepped_back
    assert (steps["stepped_back"], len(steps["stamps"])) == (stepped_back, steps_seen)
    assert steps["error"] == ("the script runs its own torch.profiler, so --profile stepped back (its trace is the"
                              " one to read)" if stepped_back else None)


def load_the_instruments(monkeypatch):
    monkeypatch.delenv("LESSONS_DOCTOR_DIR", raising=False)  # inert: loaded to call its parts, not to watch this
    spec = importlib.util.spec_from_file_location("profile_instruments", PROFILE_SITE_DIR / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Parameter:  # a stand-in: the watcher needs only an object it can hold a weak reference to
    pass


def optimizer_of(*params):
    return SimpleNamespace(param_groups=[{"params": list(params)}])


def test_every_optimizer_that_steps_is_followed_a_gan_counts_one_cycle(monkeypatch, tmp_path):
    instruments = load_the_instruments(monkeypatch)
    watcher = instruments._Watcher(str(tmp_path), 0)
    watcher.start = lambda: None  # counting only: no profiler
    generator, discriminator = Parameter(), Parameter()
    for cycle in range(3):  # a GAN: two optimizers, re-created each cycle, the generator's stepping first
        watcher.after_step(optimizer_of(generator), (), {})
        watcher.after_step(optimizer_of(discriminator), (), {})
    assert (len(watcher.stamps), watcher.failed) == (3, None)
    del generator  # a new model, the old one freed: the next optimizer to step is followed
    watcher.after_step(optimizer_of(discriminator), (), {})
    assert len(watcher.stamps) == 4


# What the ranks of a DDP script printed under --profile when rank 1 raised at step 7 (torch 2.14.1, gloo): rank 0
# lost its peer; Kineto writes its lines at the profiler's stop, after the traceback, on both ranks.
KINETO = ("USDT:2026-11-28 12:56:02 4129:4129 SyncActivityProfilerHandler.cpp:46] profiler_stop\n"
          "ERROR:2026-11-28 12:56:02 4129:4129 DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35\n")
PEER_LOST = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/home/learner/train.py", line 10, in <module>
[rank0]:     model(torch.randn(32, 64)).sum().backward()
[rank0]:   File "/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 1072, in _engine_run_backward
[rank0]:     return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass
[rank0]:            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by\
 peer [127.0.0.1]:7811. This is typically caused by a remote worker crashing.
"""
OWN_ERROR = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/home/learner/train.py", line 9, in <module>
[rank1]:     raise ValueError("a bad batch at step 7\\nIn addition, you can set something")
[rank1]: ValueError: a bad batch at step 7
[rank1]: In addition, you can set something
"""
SUMMARY = """\
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 4129)  (SIGTERM)
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 4130)
"""
UNUSED = ("RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. This"
          " error indicates that your module has parameters that were not used in producing loss.\n"
          "Parameter indices which did not receive grad for rank 1: 2 3\n"
          " In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL to"
          " print out information about which particular parameters did not receive gradient on this rank as part"
          " of this error")


def test_a_crash_is_summed_up_by_the_scripts_own_error_from_the_rank_that_raised():
    launch = LaunchResult(returncode=1, stderr={0: PEER_LOST + KINETO, 1: OWN_ERROR + KINETO}, launcher_log=SUMMARY)
    error = failure(Path("train.py"), launch)
    assert (error.rank, error.root_cause) == (1, "ValueError: a bad batch at step 7")
    assert _why_it_stopped(error).endswith("train.py:9: ValueError: a bad batch at step 7")
    traceback = "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n    step()\n" + UNUSED
    assert last_exception(traceback + "\n" + KINETO) == UNUSED.splitlines()[0]  # its first line, not the advice
    assert last_exception("Fatal Python error: Aborted\n\nsome last line\n") == "some last line"  # no traceback
    recorded = {1: {"message": {"message": UNUSED, "extraInfo": {"py_callstack": traceback, "timestamp": "1"}}}}
    from_files = LaunchResult(returncode=1, stderr={}, launcher_log=SUMMARY, attempts=[Attempt(0, errors=recorded)])
    assert failure(Path("train.py"), from_files).root_cause == UNUSED.splitlines()[0]  # @record's error file


def test_a_crash_under_profile_names_the_rank_and_its_error(tmp_path, launch_env):
    """One real launch: rank 1 raises at step 7, while the profiler runs (the old summary: rank 0, and Kineto's
    gpuGetDeviceCount line)."""
    script = tmp_path / "crash_at_step_7.py"
    script.write_text(textwrap.dedent("""\
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group("gloo")
        model = DDP(torch.nn.Linear(8, 8))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(1, 13):
            if dist.get_rank() == 1 and step == 7:
                raise ValueError("a bad batch at step 7")
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        dist.destroy_process_group()
    """))
    report = doctor(script, nproc=2, profile=True, env=launch_env)
    assert report.status == 2, str(report)
    assert report.error.startswith("rank 1 failed at ") and report.error.endswith(
        "crash_at_step_7.py:10: ValueError: a bad batch at step 7"), report.error
