"""Run the course's timing-dependent checks many times, beside a CPU-bound job, and count the failures.

    .venv/bin/python benchmarks/flaky.py                       # every item, 10 runs each, under load
    .venv/bin/python benchmarks/flaky.py --runs 20 11-evidence  # one item
    .venv/bin/python benchmarks/flaky.py --list                 # the items, and what each depends on
    .venv/bin/python benchmarks/flaky.py --load-jobs 0 ...      # on a quiet machine (2: a heavier load)

An item is a check whose verdict could depend on which rank fails, stops or prints first, or on a timeout: a pytest
node id, or a snippet that repeats a notebook cell's launch (the same script, arguments and timeout) and asserts the
same verdict the cell prints, so that one launch, not the whole notebook, is repeated. Each run is a fresh Python
process; its exit status is the verdict.

The load, by default, is what the issue that asked for this named: `pytest --nbval notebooks/03_ddp_from_scratch.ipynb`
in a loop (torch imports and 2-rank launches, as in `make test`'s other worker). A benchmark, not a test: it takes
minutes, and it prints a table of runs and failures per item.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
LOAD_COMMAND = [PYTHON, "-m", "pytest", "-q", "notebooks/03_ddp_from_scratch.ipynb"]  # pyproject's addopts: nbval
RUN_LIMIT_S = 600  # one run of one item; an item that hangs this long counts as a failure

# name: (what the verdict depends on, how to run it: "pytest NODE" or a Python snippet run from notebooks/)
ITEMS: dict[str, tuple[str, str]] = {
    "11-evidence": (
        "lesson 11 sections 5-6: rank 1's monitored-barrier error and both ranks' Flight Recorder dumps are printed "
        "though rank 0 fails first (torchrun stops the other ranks 0.1 s after one fails)",
        """
        from lessons.debugging import failed, first_difference, flight_records
        evidence = failed("../ddp_scripts/skipped_collective.py", nproc=2, timeout=60,
                          args=["--collective-timeout", 2, "--barrier", "monitored", "--flight-recorder"],
                          env={"TORCH_FR_BUFFER_SIZE": "64"})
        rank1 = evidence.result.outputs[1]
        line = ("Rank 1 successfully reached monitoredBarrier, but received errors while waiting for send/recv "
                "from rank 0")
        assert line in rank1, "rank 1 did not report its barrier:\\n" + rank1[-1500:]
        same = first_difference(flight_records(evidence))
        assert same == 7, f"the Flight Recorder lists agree on {same} entries, not 7"
        """),
    "11-hang-places": (
        "lesson 11 section 2: 3 s after both ranks printed 'trained one step', py-spy finds rank 0 in DDP's "
        "broadcast and rank 1 in the barrier",
        """
        from lessons.debugging import failed
        from lessons.tools.stacks import where
        hang = failed("../ddp_scripts/skipped_collective.py", nproc=2, timeout=3, timeout_from="trained one step")
        places = {rank: where(dump, "skipped_collective.py") for rank, dump in hang.result.stacks.items()}
        assert places[0].startswith("DistributedDataParallel._distributed_broadcast_coalesced"), places
        assert places[1].startswith("barrier"), places
        """),
    "11-ctrl-c": (
        "lesson 11 section 8: the interrupt comes once torchrun and both ranks run; none is left after it",
        """
        import signal, threading, time
        import lessons
        from lessons.tools.processes import running
        signal.signal(signal.SIGINT, signal.default_int_handler)
        SCRIPT = "../ddp_scripts/skipped_collective.py"
        during = []
        def interrupt_when_started():
            deadline = time.monotonic() + 60
            roles = ["rank 0", "rank 1", "torchrun agent"]
            while [role for pid, role in running(SCRIPT)] != roles and time.monotonic() < deadline:
                time.sleep(0.2)
            during.extend(running(SCRIPT))
            signal.raise_signal(signal.SIGINT)
        threading.Thread(target=interrupt_when_started).start()
        try:
            lessons.torchrun(SCRIPT, nproc=2, timeout=60, show=False)
        except KeyboardInterrupt:
            pass
        roles = sorted(role for pid, role in during)
        assert running(SCRIPT) == [] and roles == ["rank 0", "rank 1", "torchrun agent"], (running(SCRIPT), roles)
        """),
    "11b-uneven-hang": (
        "lesson 11b: 3 s after both ranks printed 'batches', rank 0 is in all_gather and rank 1 in a backward",
        """
        from lessons.debugging import failed
        from lessons.tools.stacks import where
        hang = failed("../ddp_scripts/uneven_inputs.py", nproc=2, timeout=3, timeout_from="batches")
        places = {rank: where(dump, "uneven_inputs.py") for rank, dump in hang.result.stacks.items()}
        assert places[0].startswith("all_gather") and "backward" in places[1], places
        """),
    "13b-early-stop": (
        "lesson 13b: a few seconds into the rank0-only run, rank 0 has logged its stop and waits in all_gather, "
        "rank 1 in a backward",
        """
        import lessons
        from lessons.tools.stacks import where
        try:
            lessons.torchrun("../ddp_scripts/early_stop.py", nproc=2, show=False, args=["--decide", "all", "rank0"],
                             timeout=3, timeout_from={0: "(rank 0 alone)", 1: "started training (--decide rank0)"})
            raise SystemExit("no hang")
        except lessons.LaunchError as error:
            hang = error
        places = {rank: where(stack, "early_stop.py") for rank, stack in hang.result.stacks.items()}
        assert places[0].startswith("all_gather") and "backward" in places[1], places
        assert "stopping at step 120" in hang.result.outputs[0], hang.result.outputs[0][-500:]
        """),
    "07b-kill": (
        "lesson 07b: rank 1 is killed; the attempt is reported as rank 1 killed by SIGKILL, not as the peer that "
        "lost its connection, and the restart resumes",
        """
        import tempfile
        import lessons
        killed = lessons.torchrun("../ddp_scripts/train_resumable.py", nproc=2, max_restarts=1, show=False,
                                  args=["--epochs", 2, "--checkpoint-dir", tempfile.mkdtemp() + "/killed",
                                        "--checkpoint-every", 10, "--crash-rank", 1, "--crash-at-step", 35])
        failures = [attempt.failure for attempt in killed.attempts]
        assert failures == ["rank 1 killed by SIGKILL", None], failures
        assert killed.result["resumed_from_step"] == 30, killed.result
        """),
    "07b-kill-3-ranks": (
        "the same at 3 ranks (tests/test_checkpoints.py)",
        "pytest tests/test_checkpoints.py::test_3_ranks_killed_mid_epoch_resume_exactly"),
    "00-99-crash": (
        "lessons 00 and 99: rank 1 crashes; rank 0's first line is printed, and torchrun's own 'Root Cause' names "
        "rank 1, with and without @record",
        """
        import lessons
        from lessons.tools.failure import torchrun_root_cause
        for args in ([], ["--without-record"]):
            try:
                lessons.torchrun("../ddp_scripts/crash_on_rank1.py", nproc=2, args=args, show=False)
                raise SystemExit("no failure")
            except lessons.LaunchError as failure:
                cause = torchrun_root_cause(failure.result.launcher_log)
                assert cause["rank"].startswith("1 "), (args, cause)
                assert failure.rank == 1, (args, failure.rank)
                assert failure.result.outputs[0].splitlines()[0] == "rank 0 started", failure.result.outputs[0]
        """),
    "99-teardown-probe": (
        "appendix: both ranks print their RESULT though rank 1 (without the fix) may abort at exit",
        """
        import lessons
        try:
            probe = lessons.torchrun("../ddp_scripts/teardown_probe.py", nproc=2, args=["--without-fix-on-rank", 1],
                                     show=False)
        except lessons.LaunchError as failure:
            probe = failure.result
        with_fix, without = (lessons.parse_result(probe.outputs[rank]) for rank in (0, 1))
        assert with_fix and without, probe.outputs
        assert with_fix["gloo_threads_alive"] == 0 and without["gloo_threads_alive"] > 0, (with_fix, without)
        """),
    "doctor-seven-mistakes": (
        "the doctor reads every rank's record, though a mismatched all-reduce ends the run",
        "pytest tests/test_doctor.py::test_mistakes_then_a_crash"),
    "exercise-ring-hint": (
        "the ring exercise's hint names rank 0 (every rank finds the mistake)",
        "pytest tests/test_exercises.py::test_typical_mistake_gets_its_hint[ring_send_everything]"),
    "exercise-frozen-crash-hint": (
        "the average_gradients hint names rank 0",
        "pytest tests/test_exercises.py::test_typical_mistake_gets_its_hint[average_gradients_frozen_crash]"),
    "exercise-resume-no-barrier": (
        "the resume exercise catches a load before rank 0 has saved (rank 0's save was delayed by a sleep)",
        "pytest tests/test_exercises.py::test_typical_mistake_gets_its_hint[resume_no_barrier]"),
    "exercise-find-the-hang": (
        "the find-the-hang starter times out 4 s after its start line, with each rank at its place",
        "pytest tests/test_exercises.py::test_starter_fails[find_the_hang]"),
    "launch-timeout-from": (
        "a 4 s timeout from 'ready' lets a script that works 1 s after it finish, torchrun's exit included",
        "pytest tests/test_launch.py::test_timeout_from_counts_from_the_line_not_from_the_start"),
    "launch-timeout-stops": (
        "an 8 s timeout from the start stops torchrun and both workers (which must have started by then)",
        "pytest tests/test_launch.py::test_timeout_stops_every_process"),
    "launch-planted-hang": (
        "a 1 s timeout from 'about to hang': each rank's place, at 2 and 3 ranks",
        "pytest tests/test_debugging.py::test_a_timeout_says_where_each_rank_was"),
    "launch-live-output": (
        "a plain Python caller sees both ranks' first lines while the launch runs",
        "pytest tests/test_debugging.py::test_live_output_reaches_a_plain_python_caller_before_the_launch_ends"),
    "launchers-tcp-nobody": (
        "an address nobody listens on is reported as 'did not meet within 2 s'",
        "pytest tests/test_launchers.py::test_a_tcp_address_nobody_listens_on_is_reported_within_the_timeout"),
    "cifar-offline": (
        "offline CIFAR-10: both ranks print their one line before either exits",
        "pytest tests/test_training.py::test_cifar10_offline_stops_every_rank_with_one_line"),
}


def run_item(code: str, log) -> tuple[bool, float, str]:
    """One run of one item, in a fresh process. Returns (passed, seconds, the last line of its output)."""
    if code.startswith("pytest "):
        command = [PYTHON, "-m", "pytest", "-q", "-x", *code.split()[1:]]
        cwd = ROOT
    else:
        command = [PYTHON, "-c", textwrap.dedent(code)]
        cwd = ROOT / "notebooks"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    try:
        done = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=RUN_LIMIT_S)
        output, passed = done.stdout, done.returncode == 0
    except subprocess.TimeoutExpired as timed_out:
        output, passed = f"{timed_out.stdout or ''}\nran past {RUN_LIMIT_S} s", False
    log.write(output + "\n")
    lines = [line for line in output.splitlines() if line.strip()]
    return passed, time.monotonic() - start, (lines[-1] if lines else "")


class Load:
    """CPU-bound jobs beside the runs: LOAD_COMMAND in a loop, each in its own process group, stopped at the end."""

    def __init__(self, jobs: int):
        self.jobs, self.processes = jobs, []

    def __enter__(self):
        loop = f"while true; do {' '.join(LOAD_COMMAND)} >/dev/null 2>&1; done"
        for _ in range(self.jobs):
            self.processes.append(subprocess.Popen(["bash", "-c", loop], cwd=ROOT, start_new_session=True))
        if self.jobs:
            time.sleep(5)  # let the first launch of the load get going
        return self

    def __exit__(self, *exc):
        for process in self.processes:
            os.killpg(process.pid, 9)
            process.wait()
        if self.processes:
            # the load's torchrun ranks run in sessions of their own: stop what is left of them
            subprocess.run(["pkill", "-9", "-f", "03_ddp_from_scratch|ddp_step[123]_|ddp_from_scratch.py"], check=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("items", nargs="*", help="items to run (default: all)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--load-jobs", type=int, default=1, help="CPU-bound jobs beside the runs (0: none)")
    parser.add_argument("--list", action="store_true", help="list the items and exit")
    args = parser.parse_args()
    if args.list:
        for name, (why, code) in ITEMS.items():
            print(f"{name}: {why}")
        return
    unknown = [name for name in args.items if name not in ITEMS]
    if unknown:
        sys.exit(f"unknown item(s): {', '.join(unknown)}; --list shows them")
    names = args.items or list(ITEMS)

    log_path = Path(tempfile.gettempdir()) / f"flaky-{os.getpid()}.log"
    results = {}
    with open(log_path, "w") as log, Load(args.load_jobs):
        for name in names:
            failures, seconds = 0, []
            for i in range(1, args.runs + 1):
                log.write(f"===== {name} run {i}\n")
                passed, elapsed, last = run_item(ITEMS[name][1], log)
                log.flush()
                seconds.append(elapsed)
                failures += not passed
                print(f"{name} run {i}: {'pass' if passed else 'FAIL: ' + last[:150]} ({elapsed:.0f} s)", flush=True)
            results[name] = (failures, sum(seconds) / len(seconds))
    print(f"\n{'item':<28} runs  failures  mean s   (load: {args.load_jobs} x {LOAD_COMMAND[-1]})")
    for name, (failures, mean) in results.items():
        print(f"{name:<28} {args.runs:>4}  {failures:>8}  {mean:>6.0f}")
    print(f"every run's output: {log_path}")


if __name__ == "__main__":
    main()
