"""Is DDP faster here? train_ddp.py as 1 process x 1 thread, 1 process x 2 threads, 2 ranks x 1 thread.

    .venv/bin/python benchmarks/scaling_train.py [--model cnn] [--epochs 10] [--repeats 3] [--batch-sizes 32 128 256 512]

For each per-rank batch size, prints samples/s for each way of using the two cores (the median of
--repeats runs; train_ddp.py times every epoch after the first, a warm-up) and the ratio of 2 ranks
to 1 rank at one thread each. A benchmark, not a test: the numbers depend on the machine.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lessons import parse_result, torchrun  # noqa: E402

SCRIPT = ROOT / "ddp_scripts" / "train_ddp.py"


def one_process(args, threads):
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, check=True)
    return parse_result(out.stdout)


def measure(options, batch_size):
    args = ["--model", options.model, "--epochs", str(options.epochs), "--batch-size", str(batch_size)]
    configs = {
        "1 process x 1 thread": lambda: one_process(args, 1),
        "1 process x 2 threads": lambda: one_process(args, 2),
        "2 ranks x 1 thread": lambda: torchrun(SCRIPT, nproc=2, args=args, show=False, threads_per_rank=1).result,
    }
    rows = {}
    for name, run in configs.items():
        results = [run() for _ in range(options.repeats)]
        rows[name] = {"samples_per_s": statistics.median(r["samples_per_s"] for r in results),
                      "final_loss": results[0]["final_loss"], "test_acc": results[0]["test_acc"]}
        print(f"  {name:<22} {rows[name]['samples_per_s']:8.0f} samples/s   final loss {rows[name]['final_loss']:.3f}"
              f"   test acc {rows[name]['test_acc']:.3f}", flush=True)
    ratio = rows["2 ranks x 1 thread"]["samples_per_s"] / rows["1 process x 1 thread"]["samples_per_s"]
    print(f"  2 ranks / 1 rank (one thread each): {ratio:.2f}x", flush=True)
    return {"batch_size": batch_size, "rows": rows, "ratio_2_ranks_vs_1": ratio}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 128, 256, 512],
                        help="per rank: larger steps amortize the all-reduce")
    options = parser.parse_args()
    if options.epochs < 2:
        parser.error("--epochs must be at least 2: the first epoch is a warm-up and is not timed")

    sweep = []
    for batch_size in options.batch_sizes:
        print(f"per-rank batch {batch_size}:", flush=True)
        sweep.append(measure(options, batch_size))
    print("RESULT " + json.dumps({"model": options.model, "epochs": options.epochs, "sweep": sweep}))


if __name__ == "__main__":
    main()
