"""Images per second through a DataLoader that decodes and augments PNG files, against num_workers.

    .venv/bin/python benchmarks/data_loading.py [--count 600] [--workers 0 1 2 4] [--repeats 3]
"""
import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lessons.data import PngDigits, loader_throughput, write_png_digits  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=600)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        dataset = PngDigits(write_png_digits(directory, args.count))
        rows = []
        for workers in args.workers:
            rate = statistics.median(loader_throughput(dataset, workers)["images_per_s"] for _ in range(args.repeats))
            rows.append({"num_workers": workers, "images_per_s": rate})
            print(f"num_workers={workers}: {rate:7.0f} images/s", flush=True)
    base = rows[0]["images_per_s"]
    print("speed-up over num_workers=0: " + ", ".join(f"{r['num_workers']}: {r['images_per_s'] / base:.2f}x" for r in rows))
    print("RESULT " + json.dumps({"count": args.count, "rows": rows}))


if __name__ == "__main__":
    main()
