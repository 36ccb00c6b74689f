"""The doctor's --profile (lessons/tools/doctor_profile.py, lesson 06b): its rules on traces built here, what it says
when there is no profile, and two real launches, a clean DDP script (silent) and one too short to profile.
Lesson 06b's nbval run is where each planted slowdown is found on real traces, and where the template is silent."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lessons.tools.doctor import PROFILE_SITE_DIR, doctor
from lessons.tools.doctor_profile import (PARTS, PROFILE_CODES, breakdown, judge, profile_findings, read_profile,
                                          read_trace, read_traces)

ROOT = Path(__file__).resolve().parent.parent


def trace(path, rank, steps, threads=1, cores=2, gpu=False, start=1000.0, cpus=(), cpu_ms=None, lines=True):
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
            kind = "_MultiProcessingDataLoaderIter" if step.get("workers") else "_SingleProcessDataLoaderIter"
            events.append({"ph": "X", "name": f"enumerate(DataLoader)#{kind}.__next__",
                           "tid": 1, "ts": at * 1e3, "dur": load * 1e3})
        at += load
        if gpu:  # the CPU launches, the device computes: kernels, NCCL's on its own stream
            events.append({"ph": "X", "name": "aten::mm", "tid": 1, "ts": at * 1e3, "dur": 1e3})
            events.append({"ph": "X", "cat": "kernel", "name": "sm90_gemm", "tid": 7, "ts": at * 1e3,
                           "dur": compute * 1e3})
        else:  # ops, and a region around them that is not work: a rank may wait inside it
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "tid": 1, "ts": at * 1e3,
                           "dur": compute * 1e3})
        if step.get("annotated"):  # a user's record_function over the whole step
            events.append({"ph": "X", "cat": "user_annotation", "name": "train_step", "tid": 1, "ts": t * 1e3,
                           "dur": total * 1e3})
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
            # where the training thread was, as the instruments sample it (read_profile): a sleep at line 75
            "lines_ms_a_step": {"train.py:75 in main": steps[0].get("before", 0) if lines else 0,
                                "train.py:80 in main": 80},
            "threads_and_cores": json.dumps({"threads": threads, "cores": cores, "host": "node0",
                                             "cpus": list(cpus)[2 * rank:2 * rank + 2] if cpus else []})}
    if cpu_ms:  # the CPU time the rank's threads got a step, as the instruments record it (read_profile)
        meta["cpu_and_wall_ms"] = [cpu_ms[rank], total]
    Path(path).write_text(json.dumps({**meta, "traceEvents": events}))
    return path


def judged(tmp_path, rank0, rank1, **kwargs):
    """(codes, can't-judge lines, steps, findings) of two ranks' traces."""
    paths = [trace(tmp_path / "rank0.json", 0, rank0, **kwargs), trace(tmp_path / "rank1.json", 1, rank1, **kwargs)]
    ranks = read_traces(paths)
    found, unsure = judge(ranks, {r: read_trace(p)[1] for r, p in enumerate(paths)})
    return [f.code for f in found], unsure, ranks, found


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
    codes, unsure, _, _ = judged(tmp_path, rank0, rank1, **kwargs)
    assert (codes, unsure) == (expected, []), case
    assert set(codes) <= set(PROFILE_CODES)


def test_waiting_needs_no_shared_clock(tmp_path):
    """Rank 1's clock is 10 s ahead of rank 0's: rank 0's wait is still its exposed time less rank 1's, and rank 1's
    sleep, which no op records, is its "other"."""
    paths = [trace(tmp_path / "rank0.json", 0, [{"exposed": 155}] * STEPS),
             trace(tmp_path / "rank1.json", 1, [{"before": 150}] * STEPS, start=11_000.0)]
    table = breakdown(read_traces(paths))
    assert (table[0]["waiting"], table[0]["exposed"], table[1]["waiting"], table[1]["other"]) == (150, 5, 0, 152)


LATE = [14, 11, 30, 12, 24]  # ms: how late a rank is, step by step
NOISY = [(18, 70), (22, 90), (19, 75), (24, 95), (20, 80)]  # (ms late, ms of compute): steps that vary nearly as much


@pytest.mark.parametrize("case, rank0, rank1, kwargs, expected", [
    # the issue's: rank 1 sleeps 30 ms before every step, rank 0 waits 31 ms of its 40 ms step
    ("a 30 ms straggler", [{"compute": 7, "exposed": 31, "other": 1}] * STEPS,
     [{"before": 30, "compute": 7, "exposed": 1, "other": 1}] * STEPS, {}, ["straggler"]),
    ("late by 11 to 30 ms every step", [{"exposed": 5 + w} for w in LATE], [{"before": w} for w in LATE], {},
     ["straggler"]),
    ("rank 0 the straggler", [{"before": 30, "compute": 7, "exposed": 1}] * STEPS,
     [{"compute": 7, "exposed": 31}] * STEPS, {}, ["straggler"]),
    ("a straggler inside the user's record_function", [{"exposed": 155, "annotated": True}] * STEPS,
     [{"before": 150, "annotated": True}] * STEPS, {}, ["straggler"]),
    ("12 ms steps, half of them exposed", [{"compute": 4, "exposed": 6}] * STEPS,
     [{"compute": 4, "exposed": 6}] * STEPS, {}, ["exposed-communication"]),
    ("a busy machine: the late rank changes",
     [{"exposed": 5 + w} if i % 2 else {"before": w} for i, w in enumerate(LATE)],
     [{"before": w} if i % 2 else {"exposed": 5 + w} for i, w in enumerate(LATE)], {}, []),
    ("exposed 21%, below the rule", [{"compute": 75, "exposed": 21}] * STEPS, [{"compute": 75, "exposed": 21}] * STEPS,
     {}, []),
    ("gpu, short steps", [{"compute": 4, "exposed": 6}] * STEPS, [{"compute": 4, "exposed": 6}] * STEPS, {"gpu": True},
     ["exposed-communication"]),
])
def test_steps_of_any_length_are_judged_from_their_evidence(tmp_path, case, rank0, rank1, kwargs, expected):
    codes, unsure, _, _ = judged(tmp_path, rank0, rank1, **kwargs)
    assert (codes, unsure) == (expected, []), case


@pytest.mark.parametrize("case, rank0, rank1, line", [
    ("late every step, by not much more than the steps vary", [{"exposed": 5 + w, "compute": c} for w, c in NOISY],
     [{"before": w, "compute": c} for w, c in NOISY],
     "can't judge whether rank 1 is a straggler: the others wait for it 20.0 ms of their 107.0 ms step, against this"
     " run's noise: waits and steps that vary by 14.8 ms, a transfer of 5.0 ms"),
    ("exposed 16 to 34% of the steps", [{"compute": 75, "exposed": e} for e in (15, 34, 24, 30, 26)],
     [{"compute": 75, "exposed": e} for e in (15, 34, 24, 30, 26)],
     "can't judge whether communication is exposed: rank 0's exposed is 16–31% of its steps (3 of 5 at 25% or more"),
])
def test_what_the_noise_swamps_is_not_judged_and_says_so(tmp_path, case, rank0, rank1, line):
    codes, unsure, _, _ = judged(tmp_path, rank0, rank1)
    assert codes == [] and len(unsure) == 1 and unsure[0].startswith(line), unsure


def test_a_rank_slowed_by_other_programs_is_not_the_scripts_straggler(tmp_path):
    """Rank 0's ops take 30 ms longer every step. With 30 CPU-ms more a step it did more work: a straggler. With the
    same CPU time as rank 1, its threads waited for a core (a busy machine): not the script's, and said so."""
    late, prompt = [{"compute": 110, "exposed": 5}] * STEPS, [{"compute": 80, "exposed": 35}] * STEPS
    codes, unsure, _, _ = judged(tmp_path, late, prompt, cpu_ms=[110, 80])
    assert (codes, unsure) == (["straggler"], [])
    codes, unsure, _, _ = judged(tmp_path, late, prompt, cpu_ms=[81, 80])
    assert codes == [] and unsure == [
        "can't judge whether rank 0 is a straggler: the others wait for it 30.0 ms of their 117.0 ms step, in 5 of 5"
        " steps, but its longer ops got no more CPU time than theirs (81.0 against 80.0 CPU-ms a step): its threads"
        " waited for a core that other programs held, not for more work. Run it with the cores free"]
    codes, _, _, _ = judged(tmp_path, [{"exposed": 155}] * STEPS, [{"before": 150}] * STEPS, cpu_ms=[80, 80])
    assert codes == ["straggler"]  # a sleep at a line of the script: its time is in no op, whatever the CPU time
    codes, unsure, _, _ = judged(tmp_path, [{"exposed": 155}] * STEPS, [{"before": 150}] * STEPS, cpu_ms=[80, 80],
                                 lines=False)  # the same time in no op, but at no line of the script: the machine
    assert codes == [] and "are in no op and at no line of the script" in unsure[0]


def two_collectives(tmp_path, ops):
    """Two ranks' traces: in each 106 ms step, the ranks' ops (OPS[rank]), then two all-reduces. Rank 0 is 30 ms
    late to the 1st, rank 1 to the 2nd."""
    def rank(r):
        events, t = [], 0.0
        for number in range(1, STEPS + 1):
            calls = [(50, 52), (72, 104)] if r == 0 else [(20, 52), (102, 104)]
            events.append({"ph": "X", "name": f"ProfilerStep#{number}", "tid": 1, "ts": t * 1e3, "dur": 106e3})
            events += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": 1, "ts": (t + a) * 1e3,
                        "dur": (b - a) * 1e3} for a, b in ops[r]]
            events += [{"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "tid": 2,
                        "ts": (t + a) * 1e3, "dur": (b - a) * 1e3} for a, b in calls]
            t += 106
        path = tmp_path / f"rank{r}.json"
        path.write_text(json.dumps({"distributedInfo": {"rank": r}, "traceEvents": events}))
        return path
    return read_traces([rank(0), rank(1)])


def test_late_at_different_collectives_is_waiting_not_exposed_communication(tmp_path):
    """Each rank waits 30 ms, so the whole step's exposed time is the same on both ranks, and only matching the k-th
    collective tells the waits apart. Each is late after 30 ms in no op (a sleep): a straggler at its collective."""
    ranks = two_collectives(tmp_path, {0: [(30, 50), (52, 72)], 1: [(0, 20), (52, 72)]})
    found, unsure = judge(ranks)
    assert [f.code for f in found] == ["straggler", "straggler"] and unsure == []
    assert "rank 0 arrives last" in str(found[0]) + str(found[1]) and "at the 1st of the step's 2 collectives" in (
        str(found[0]) + str(found[1]))
    table = breakdown(ranks)
    assert [(round(table[r]["waiting"]), round(table[r]["exposed"])) for r in (0, 1)] == [(30, 4), (30, 4)]


def test_late_with_nothing_of_its_own_to_show_for_it_is_the_machine(tmp_path):
    """The same waits, but each late rank's ops simply took 30 ms longer there, and as long in all: what a busy
    machine does (the OS ran one rank later, then the other). No straggler of the script's: two can't-judge lines."""
    found, unsure = judge(two_collectives(tmp_path, {0: [(0, 50), (52, 72)], 1: [(0, 20), (52, 102)]}))
    assert found == [] and len(unsure) == 2 and all(
        "nothing of its own makes it late: no part of its step is longer than theirs" in line for line in unsure)


def test_the_lines_a_user_acts_on(tmp_path):
    """The breakdown adds up; a share quoted for a rank is that rank's; the straggler's line names its call site; the
    loader's advice reads the script's workers and the cores each rank has."""
    codes, _, ranks, found = judged(tmp_path, [{"exposed": 155}] * STEPS, [{"before": 150}] * STEPS)
    for row in breakdown(ranks).values():
        assert sum(row[p] for p in PARTS) == pytest.approx(row["step"])
    assert "its extra time is at train.py:75 in main (+150.0 ms a step)" in str(found[0])
    codes, _, ranks, found = judged(tmp_path, [{"loader": 30}] * STEPS, [{"loader": 60}] * STEPS, cores=8)
    row = breakdown(ranks)[1]
    assert str(found[0]).startswith(f"loader-bound: rank 1's steps wait for the DataLoader"
                                    f" {round(100 * row['loader'] / row['step'])}% of their time (its median step:"
                                    f" {row['loader']:.1f} of {row['step']:.1f} ms) — decode in DataLoader workers"
                                    f" (num_workers, 3 a rank on this host, persistent_workers)")
    *_, found = judged(tmp_path, [{"loader": 60, "workers": True}] * STEPS, [{"loader": 60, "workers": True}] * STEPS)
    assert "no core is free for more loader workers here" in str(found[0])
    *_, found = judged(tmp_path, [{"loader": 60, "workers": True}] * STEPS, [{"loader": 60, "workers": True}] * STEPS,
                       cores=8)
    assert "already reads from workers: more of them (num_workers, up to 3 more a rank on this host)" in str(found[0])
    *_, found = judged(tmp_path, [{"exposed": 40}] * STEPS, [{"exposed": 40}] * STEPS)  # all-reduced after backward
    assert "none of it overlaps the work: let DDP's buckets overlap it" in str(found[0])
    *_, found = judged(tmp_path, [{"exposed": 40, "hidden": 20}] * STEPS, [{"exposed": 40, "hidden": 20}] * STEPS)
    assert "the collectives already overlap the work (DDP's buckets): give each rank more work" in str(found[0])


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
    # silent: nothing found; a "can't judge" line with its numbers is allowed where a busy machine's steps vary
    last = done.stdout.splitlines()[-1]
    assert done.returncode == 0 and last.startswith("no slowdowns found"), done.stdout + done.stderr
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
    import lessons.tools.doctor_launch as launch_module

    seen = []

    def fake_torchrun(script, env, **kwargs):
        seen.append(env.get("OMP_NUM_THREADS"))
        raise ValueError("stopped here")
    monkeypatch.setattr(launch_module, "torchrun", fake_torchrun)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    doctor(ROOT / "ddp_scripts" / "ddp_minimal.py", profile=True)
    doctor(ROOT / "ddp_scripts" / "ddp_minimal.py")
    monkeypatch.delenv("OMP_NUM_THREADS")
    doctor(ROOT / "ddp_scripts" / "ddp_minimal.py", profile=True)
    assert seen == ["3", "3", None]
