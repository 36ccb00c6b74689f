"""The doctor's --profile (lessons/tools/doctor_profile.py, lesson 06b): its rules on traces built here, what it says
when there is no profile, and two real launches, a clean DDP script (silent) and one too short to profile.
Lesson 06b's nbval run is where each planted slowdown is found on real traces, and where the template is silent."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lessons.tools.doctor import PROFILE_SITE_DIR, doctor
from lessons.tools.doctor_profile import (MIN_STEP_MS, PROFILE_CODES, breakdown, profile_findings, read_profile,
                                          read_trace, read_traces, too_short)

ROOT = Path(__file__).resolve().parent.parent


def trace(path, rank, steps, threads=1, cores=2, gpu=False, start=1000.0, cpus=()):
    """A Chrome trace as torch.profiler writes one: each step (ms) is loader, compute, then communication with the
    training thread idle (exposed), then time nothing records. hidden: communication during the compute."""
    events, t = [], start
    for number, step in enumerate(steps, 1):
        load, compute, exposed = step.get("loader", 0), step.get("compute", 80), step.get("exposed", 5)
        before, hidden = step.get("before", 0), step.get("hidden", 0)
        total = before + load + compute + exposed + step.get("other", 2)
        events.append({"ph": "X", "name": f"ProfilerStep#{number}", "tid": 1, "ts": t * 1e3, "dur": total * 1e3})
        at = t + before
        if load:
            events.append({"ph": "X", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                           "tid": 1, "ts": at * 1e3, "dur": load * 1e3})
        at += load
        if gpu:  # the CPU launches, the device computes: kernels, NCCL's on its own stream
            events.append({"ph": "X", "name": "aten::mm", "tid": 1, "ts": at * 1e3, "dur": 1e3})
            events.append({"ph": "X", "cat": "kernel", "name": "sm90_gemm", "tid": 7, "ts": at * 1e3,
                           "dur": compute * 1e3})
        else:
            events.append({"ph": "X", "name": "DistributedDataParallel.forward", "tid": 1, "ts": at * 1e3,
                           "dur": compute * 1e3})
        if hidden:
            events.append({"ph": "X", "cat": "kernel" if gpu else "user_annotation",
                           "name": "ncclDevKernel_AllReduce" if gpu else "gloo:all_reduce", "tid": 9 if gpu else 2,
                           "ts": (at + compute - hidden) * 1e3, "dur": hidden * 1e3})
        at += compute
        if exposed:
            events.append({"ph": "X", "cat": "kernel" if gpu else "user_annotation",
                           "name": "ncclDevKernel_AllReduce" if gpu else "gloo:all_reduce", "tid": 9 if gpu else 3,
                           "ts": at * 1e3, "dur": exposed * 1e3})
        t += total
    meta = {"distributedInfo": {"rank": rank, "world_size": 2}, "host_name": "node0",
            "threads_and_cores": json.dumps({"threads": threads, "cores": cores, "host": "node0",
                                             "cpus": list(cpus)[2 * rank:2 * rank + 2] if cpus else []})}
    Path(path).write_text(json.dumps({**meta, "traceEvents": events}))
    return path


def judge(tmp_path, rank0, rank1, **kwargs):
    paths = [trace(tmp_path / "rank0.json", 0, rank0, **kwargs), trace(tmp_path / "rank1.json", 1, rank1, **kwargs)]
    ranks = read_traces(paths)
    return [f.code for f in profile_findings(ranks, {r: read_trace(p)[1] for r, p in enumerate(paths)})], ranks


STEPS = 5


@pytest.mark.parametrize("case, rank0, rank1, kwargs, expected", [
    ("clean", [{}] * STEPS, [{}] * STEPS, {}, []),
    ("overlapped", [{"hidden": 60}] * STEPS, [{"hidden": 60}] * STEPS, {}, []),
    ("straggler", [{"exposed": 155}] * STEPS, [{"before": 150}] * STEPS, {}, ["straggler"]),
    ("late in 2 of 5", [{"exposed": 155}] * 2 + [{}] * 3, [{"before": 150}] * 2 + [{}] * 3, {}, []),
    ("loader", [{"loader": 40}] * STEPS, [{"loader": 40}] * STEPS, {}, ["loader-bound"]),
    ("by hand", [{"exposed": 40}] * STEPS, [{"exposed": 40}] * STEPS, {}, ["exposed-communication"]),
    ("threads", [{"exposed": 155}] * STEPS, [{"before": 150}] * STEPS, {"threads": 2},
     ["threads-oversubscribed"]),  # the straggler it causes is not reported apart
    ("threads to spare", [{}] * STEPS, [{}] * STEPS, {"threads": 2, "cores": 4}, []),
    ("each rank pinned to 2 CPUs of its own", [{}] * STEPS, [{}] * STEPS, {"threads": 2, "cpus": range(4)}, []),
    ("both ranks on the same 2 CPUs", [{}] * STEPS, [{}] * STEPS, {"threads": 2, "cpus": [0, 1, 0, 1]},
     ["threads-oversubscribed"]),
    ("gpu, exposed", [{"compute": 20, "exposed": 15}] * STEPS, [{"compute": 20, "exposed": 15}] * STEPS,
     {"gpu": True}, ["exposed-communication"]),
    ("gpu, overlapped", [{"compute": 20, "hidden": 15, "exposed": 0}] * STEPS,
     [{"compute": 20, "hidden": 15, "exposed": 0}] * STEPS, {"gpu": True}, []),
])
def test_each_slowdown_from_the_traces(tmp_path, case, rank0, rank1, kwargs, expected):
    codes, _ = judge(tmp_path, rank0, rank1, **kwargs)
    assert codes == expected, case
    assert set(codes) <= set(PROFILE_CODES)


def test_waiting_needs_no_shared_clock(tmp_path):
    """Rank 1's clock is 10 s ahead of rank 0's: rank 0's wait is still its exposed time less rank 1's, and rank 1's
    sleep, which no op records, is its "other"."""
    paths = [trace(tmp_path / "rank0.json", 0, [{"exposed": 155}] * STEPS),
             trace(tmp_path / "rank1.json", 1, [{"before": 150}] * STEPS, start=11_000.0)]
    table = breakdown(read_traces(paths))
    assert (table[0]["waiting"], table[0]["exposed"], table[1]["waiting"], table[1]["other"]) == (150, 5, 0, 152)


def test_cpu_steps_too_short_are_not_judged_gpu_steps_are(tmp_path):
    short = [{"compute": 4, "exposed": 6}] * STEPS  # 12 ms, half of it exposed
    codes, ranks = judge(tmp_path, short, short)
    assert codes == [] and f"steps of {MIN_STEP_MS:.0f} ms or more" in too_short(ranks)
    codes, ranks = judge(tmp_path, short, short, gpu=True)
    assert codes == ["exposed-communication"] and too_short(ranks) is None


def steps_file(folder, rank, stamps, error=None):
    (folder / f"rank{rank}.steps.json").write_text(json.dumps(
        {"stamps": stamps, "needed": 10, "timed": [1, 4], "profiled": [5, 10], "error": error}))


def test_no_profile_says_why_in_one_line(tmp_path):
    steps_file(tmp_path, 0, [0.1 * i for i in range(10)])
    assert read_profile(tmp_path, 2)[3].startswith("rank 1 wrote no profile")
    steps_file(tmp_path, 1, [0.1 * i for i in range(4)])
    assert read_profile(tmp_path, 2)[3] == ("rank 1 made 4 optimizer step(s), and --profile needs 10 (1 to warm up,"
                                            " 3 timed, 1 + 5 profiled): give the script more steps (its own"
                                            " arguments after --)")
    steps_file(tmp_path, 1, [0.1 * i for i in range(10)], error="RuntimeError: a profiler is already running")
    assert "is the script profiling itself?" in read_profile(tmp_path, 2)[3]
    steps_file(tmp_path, 1, [0.1 * i for i in range(10)])
    assert read_profile(tmp_path, 2)[3] == "no trace from rank0.json: the profiler did not export it"
    for rank in range(2):
        trace(tmp_path / f"rank{rank}.json", rank, [{}] * STEPS)
    ranks, metas, lines, why = read_profile(tmp_path, 2)
    assert why is None and lines[-1].startswith("profile cost: rank 0's profiled steps took 1.00x")


@pytest.mark.parametrize("kwargs, line", [
    ({"compare": True}, "--profile watches speed and --compare the trained model: run them one at a time"),
    ({"profile": False, "trace_dir": "x"}, "--trace-dir keeps --profile's traces: add --profile"),
])
def test_options_that_do_not_go_together(kwargs, line):
    report = doctor(ROOT / "ddp_scripts" / "ddp_minimal.py", **{"profile": True, **kwargs})
    assert (report.status, str(report)) == (2, f"the script did not run to the end: {line}")


def test_a_clean_script_is_silent_and_a_short_one_has_no_profile(tmp_path):
    """Two real launches: the clean case of lesson 06b's script (DDP's buckets, data decoded ahead, steps of tens of
    ms), traces kept; and ddp_minimal.py's 5 steps, too few to profile (exit 2, one line)."""
    done = subprocess.run([sys.executable, "-m", "lessons", "doctor", "ddp_scripts/profile_ranks.py", "-n", "2",
                           "--profile", "--trace-dir", str(tmp_path), "--", "--cases", "clean", "--batch", "96"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout.splitlines()[-1]) == (0, "no slowdowns found"), done.stdout + done.stderr
    assert [s.number for s in read_traces(sorted(tmp_path.glob("rank*.json")))[1]] == [1, 2, 3, 4, 5]
    short = subprocess.run([sys.executable, "-m", "lessons", "doctor", "ddp_scripts/ddp_minimal.py", "-n", "2",
                            "--profile"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert (short.returncode, short.stdout.strip()) == (2, "no profile: rank 0 made 5 optimizer step(s), and"
                                                           " --profile needs 10 (1 to warm up, 3 timed, 1 + 5"
                                                           " profiled): give the script more steps (its own"
                                                           " arguments after --)")


def test_the_profile_instruments_are_inert_outside_a_rank(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PROFILE_SITE_DIR), "LESSONS_DOCTOR_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", "import sys; print('torch' in sys.modules)"], env=env,
                          capture_output=True, text=True)
    assert (done.returncode, done.stdout, list(tmp_path.iterdir())) == (0, "False\n", [])


def test_the_ranks_keep_the_users_omp_num_threads(monkeypatch):
    """torchrun keeps an OMP_NUM_THREADS it is given (and sets 1 only when none is): so does the doctor, or it would
    profile another run than the user's (and never see oversubscribed threads)."""
    import lessons.tools.doctor as doctor_module

    seen = []

    def fake_torchrun(script, env, **kwargs):
        seen.append(env.get("OMP_NUM_THREADS"))
        raise ValueError("stopped here")
    monkeypatch.setattr(doctor_module, "torchrun", fake_torchrun)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    doctor(ROOT / "ddp_scripts" / "ddp_minimal.py", profile=True)
    doctor(ROOT / "ddp_scripts" / "ddp_minimal.py")
    monkeypatch.delenv("OMP_NUM_THREADS")
    doctor(ROOT / "ddp_scripts" / "ddp_minimal.py", profile=True)
    assert seen == ["3", "3", None]
