"""Stress the end of a DDP run: launch a DDP script N times, count the launches that fail.

    .venv/bin/python benchmarks/stress_teardown.py --runs 200             # the course's scripts
    .venv/bin/python benchmarks/stress_teardown.py --runs 40 --baseline   # same, without the fix

The baseline is ddp_scripts/ddp_minimal.py without `import ddp_common`, i.e. without the
teardown fix explained in ddp_scripts/ddp_common.py. A benchmark, not a test: it takes
minutes, and a rare failure is a rate to report, not a pass/fail.
"""
import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lessons import LaunchError, torchrun  # noqa: E402

FIXED = ROOT / "ddp_scripts" / "ddp_minimal.py"


def unfixed_copy(directory: str) -> Path:
    """ddp_minimal.py with the ddp_common import replaced by the same backend choice, inline."""
    source = FIXED.read_text().replace(
        "from ddp_common import backend_and_device  # import before init_process_group",
        "def backend_and_device():\n    return 'gloo', torch.device('cpu')",
    )
    assert "ddp_common" not in source, "the baseline must not import the fix"
    path = Path(directory) / "ddp_minimal_unfixed.py"
    path.write_text(source)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--baseline", action="store_true", help="launch the script without the fix")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        script = unfixed_copy(tmp) if args.baseline else FIXED
        failures = collections.Counter()
        start = time.monotonic()
        for i in range(1, args.runs + 1):
            try:
                torchrun(script, nproc=args.nproc, args=["--steps", "3"], show=False, timeout=120)
            except LaunchError as e:
                first_line = str(e).splitlines()[0]
                failures[first_line.split("(", 1)[-1].rstrip("):")] += 1
                print(f"launch {i}: {first_line}", flush=True)
            if i % 20 == 0:
                print(f"... {i} launches, {sum(failures.values())} failed", flush=True)
        elapsed = time.monotonic() - start

    failed = sum(failures.values())
    print(f"{'baseline (no fix)' if args.baseline else 'with the fix'}: {args.runs} launches of "
          f"{script.name} x {args.nproc} ranks, {failed} failed ({dict(failures)}), {elapsed:.0f} s")
    print("RESULT " + json.dumps({"script": script.name, "baseline": args.baseline, "runs": args.runs,
                                  "nproc": args.nproc, "failed": failed, "kinds": dict(failures)}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
