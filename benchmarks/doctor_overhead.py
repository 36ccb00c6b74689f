"""What the DDP doctor adds to a launch: the same 2-rank run of ddp_scripts/template.py with lessons.torchrun and
with lessons.doctor, alternated, each timed wall-clock.

    .venv/bin/python benchmarks/doctor_overhead.py --runs 3
    .venv/bin/python benchmarks/doctor_overhead.py --runs 3 --script train.py --cwd DIR -- ARGS   # any script

(the public scripts of benchmarks/public_scripts.py: a patched copy of each, made with its --keep).

The ranks run side by side, so the difference of the medians is what the instruments add to each rank's run
(plus the doctor's reading of the ranks' files). Lesson 14 and the issue's budget: under 2 s per rank.
A benchmark, not a test: on a loaded 2-core machine one launch varies by seconds.
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lessons import LaunchError, doctor, torchrun  # noqa: E402

SCRIPT = ROOT / "ddp_scripts" / "template.py"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--script", type=Path, help="another script than the template")
    parser.add_argument("--cwd", type=Path, help="the folder to run --script in")
    parser.add_argument("args", nargs="*", help="--script's arguments, after --")
    options = parser.parse_args()
    if options.script:
        return other_script(options)
    plain, doctored = [], []
    with tempfile.TemporaryDirectory() as directory:
        args = ["--epochs", "1", "--checkpoint", str(Path(directory) / "ckpt.pt")]
        for _ in range(options.runs):
            start = time.perf_counter()
            torchrun(SCRIPT, nproc=options.nproc, args=args, show=False)
            plain.append(time.perf_counter() - start)
            Path(directory, "ckpt.pt").unlink()
            start = time.perf_counter()
            report = doctor(SCRIPT, nproc=options.nproc, args=args)
            doctored.append(time.perf_counter() - start)
            Path(directory, "ckpt.pt").unlink()
            assert report.status == 0, str(report)
    report_times(plain, doctored, options.nproc)


def report_times(plain, doctored, nproc):
    added = statistics.median(doctored) - statistics.median(plain)
    print(f"lessons.torchrun: median {statistics.median(plain):.2f} s  ({', '.join(f'{s:.2f}' for s in plain)})")
    print(f"lessons.doctor:   median {statistics.median(doctored):.2f} s  ({', '.join(f'{s:.2f}' for s in doctored)})")
    print(f"the doctor adds {added:.2f} s to a {nproc}-rank launch (ranks in parallel: {added:.2f} s per rank);"
          f" ratio {statistics.median(doctored) / statistics.median(plain):.2f}")


def other_script(options):
    """The same alternation for a script of one's own, run in its folder (its outputs are its own business)."""
    import os
    os.chdir(options.cwd or options.script.parent)
    plain, doctored = [], []
    for _ in range(options.runs):
        start = time.perf_counter()
        try:
            torchrun(options.script, nproc=options.nproc, args=options.args, show=False)
        except LaunchError as error:  # a script that fails plainly is timed as it is
            print(f"the plain launch failed: {error}", file=sys.stderr)
        plain.append(time.perf_counter() - start)
        start = time.perf_counter()
        doctor(options.script, nproc=options.nproc, args=options.args)
        doctored.append(time.perf_counter() - start)
    report_times(plain, doctored, options.nproc)


if __name__ == "__main__":
    main()
