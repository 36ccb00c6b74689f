"""Not a test: the doctor's --profile on planted slowdowns and clean controls, several runs each, on a quiet machine
and with busy loops beside it. Each case must get exactly its expected codes every time (benchmarks/LOG.md keeps the
table).

    python benchmarks/profile_verdicts.py --runs 5 --busy 0     # quiet
    python benchmarks/profile_verdicts.py --runs 5 --busy 2     # two busy-loop processes beside every run
    python benchmarks/profile_verdicts.py --pin 0 --cases clean  # 2 ranks on one core: threads-oversubscribed

The cases are benchmarks/profile_planted/planted.py's, with steps of 30 to 200 ms on a 2-core machine.
"""
import argparse
import multiprocessing
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLANTED = ROOT / "benchmarks" / "profile_planted" / "planted.py"
# case: (the script's arguments, the codes --profile must print, nothing more)
CASES = {
    "clean": (["--batch", "256"], []),
    "clean-larger": (["--batch", "512"], []),
    # 10-20 ms steps, of which the all-reduce is a third to a half on 2 CPU cores: communication-bound for real, so
    # exposed-communication is right, and so is nothing where the run's steps vary too much to say (not a control)
    "small-steps": ([], [[], ["exposed-communication"]]),
    "straggler-30ms": (["--case", "straggler", "--sleep-ms", "30"], ["straggler"]),
    "straggler-rank0": (["--case", "straggler-rank0", "--sleep-ms", "40"], ["straggler"]),
    "straggler-in-forward": (["--case", "straggler-in-forward", "--sleep-ms", "60"], ["straggler"]),
    "straggler-in-annotation": (["--case", "straggler-in-annotation", "--sleep-ms", "60"], ["straggler"]),
    "late-both": (["--case", "late-both", "--sleep-ms", "30"], ["straggler", "straggler"]),
    "loader": (["--case", "loader"], ["loader-bound"]),
    "by-hand": (["--case", "by-hand", "--width", "2048", "--batch", "8"], ["exposed-communication"]),
}


def busy():
    while True:
        pass


def run(case, pin):
    args, expected = CASES[case]
    command = [sys.executable, "-m", "lessons", "doctor", str(PLANTED), "-n", "2", "--profile", "--", *args]
    if pin is not None:
        command = ["taskset", "-c", pin, *command]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    codes = [line.split(":")[0] for line in done.stdout.splitlines()
             if re.match(r"^(straggler|loader-bound|exposed-communication|threads-oversubscribed):", line)]
    steps = re.findall(r"^\s+\d+\s+([\d.]+)\s", done.stdout, re.M)
    unsure = sum(line.startswith("can't judge") for line in done.stdout.splitlines())
    return codes, steps, unsure, done, time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--busy", type=int, default=0, help="busy-loop processes beside every run")
    parser.add_argument("--pin", help="taskset -c PIN for the whole launch (e.g. 0: one core)")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()
    loops = [multiprocessing.Process(target=busy, daemon=True) for _ in range(args.busy)]
    for loop in loops:
        loop.start()
    wrong = 0
    try:
        print(f"| case | expected | right | steps ms (rank 0) | can't judge | s a run |")
        print("|---|---|---|---|---|---|")
        for case in args.cases:
            expected = ["threads-oversubscribed"] if args.pin and len(args.pin) == 1 else CASES[case][1]
            allowed = expected if expected and isinstance(expected[0], list) else [expected]
            right, steps, unsure, seconds = 0, [], 0, 0.0
            for _ in range(args.runs):
                codes, step, doubt, done, took = run(case, args.pin)
                ok = codes in allowed and done.returncode == (3 if codes else 0)
                right += ok
                unsure += doubt
                seconds += took
                steps += step[:1]
                if not ok:
                    wrong += 1
                    print(f"<!-- {case}: got {codes}, exit {done.returncode}\n{done.stdout[-3000:]}\n"
                          f"{done.stderr[-1500:]} -->", flush=True)
            print(f"| {case} | {' or '.join(', '.join(codes) or 'nothing' for codes in allowed)} | {right}/{args.runs} | {' '.join(steps)} |"
                  f" {unsure} | {seconds / args.runs:.1f} |", flush=True)
    finally:
        for loop in loops:
            loop.kill()
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
