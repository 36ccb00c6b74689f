"""Reuse a file:// init path that a dead run left behind, N times: how often do the ranks fail, and how?

    .venv/bin/python benchmarks/stale_init_file.py --runs 8

Each run: a first run of ddp_scripts/init_methods.py dies right after init_process_group (its file stays),
then a second run reuses the path (--reuse-stale-file). Whether the second run's ranks read the dead run's
addresses or each other's is a race, so lesson 10 reports the rate measured here, not one run's outcome.
A benchmark, not a test: a race is a rate to report, not a pass/fail.
"""
import argparse
import collections
import json
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lessons import LaunchError, run_python  # noqa: E402

SCRIPT = ROOT / "ddp_scripts" / "init_methods.py"


def outcome_of_a_reuse(timeout_s: float) -> str:
    with tempfile.TemporaryDirectory() as directory:
        same_file = ["--init-method", "file", "--file", str(Path(directory) / "init"), "--timeout", str(timeout_s)]
        try:
            run_python(SCRIPT, same_file + ["--crash-after-init"], show=False)
        except LaunchError:
            pass  # it dies on purpose, leaving its file behind
        try:
            run_python(SCRIPT, same_file + ["--reuse-stale-file"], show=False)
            return "met"
        except LaunchError as error:
            if "did not meet within" in error.root_cause:
                return "failed: timeout"
            for reason in ("Connection refused", "Connection reset by peer", "Connection closed by peer"):
                if reason in error.root_cause:
                    return f"failed: {reason}"
            error_type = re.search(r"\b([A-Z]\w+Error)\b", error.root_cause)
            return f"failed: {error_type.group(1) if error_type else error.root_cause[:80]}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=5.0, help="init_methods.py --timeout of each run")
    args = parser.parse_args()
    if args.runs < 1:
        sys.exit("--runs must be >= 1")
    outcomes = collections.Counter()
    for run in range(args.runs):
        outcome = outcome_of_a_reuse(args.timeout)
        outcomes[outcome] += 1
        print(f"run {run + 1}/{args.runs}: {outcome}", flush=True)
    failed = sum(n for outcome, n in outcomes.items() if outcome != "met")
    print(f"a reused file broke {failed} of {args.runs} runs")
    print("RESULT " + json.dumps({"runs": args.runs, "failed": failed, "outcomes": dict(outcomes)}))


if __name__ == "__main__":
    main()
