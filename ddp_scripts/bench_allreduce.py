"""Benchmark: torch's all_reduce vs our ring, from 4 KB to 64 MB, in algbw and busbw.

    torchrun --standalone --nproc-per-node=4 ddp_scripts/bench_allreduce.py

Definitions as in nccl-tests: algbw = bytes / time; busbw = algbw * 2(N-1)/N, the rate
each rank's link actually carries in a ring, so it is comparable across world sizes.
A timing is the slowest rank's (the collective ends when the last rank is done); we
report the median over iterations, after warm-up.
"""
import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

from ddp_common import backend_and_device  # import before init_process_group
from ring_allreduce import Traffic, ring_all_reduce

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]  # bytes


def time_one(all_reduce, tensor, device) -> float:
    dist.barrier()  # start together, so we time the collective, not the stragglers
    start = time.perf_counter()
    all_reduce(tensor)
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-bytes", type=int, default=SIZES[-1])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()

    backend, device = backend_and_device()
    dist.init_process_group(backend)
    n = dist.get_world_size()
    implementations = {
        "builtin": lambda t: dist.all_reduce(t),
        "ring": lambda t: ring_all_reduce(t, Traffic()),
    }
    rows = []
    for size in [s for s in SIZES if s <= args.max_bytes]:
        tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
        for name, all_reduce in implementations.items():
            for _ in range(args.warmup):
                time_one(all_reduce, tensor, device)
            seconds = statistics.median(time_one(all_reduce, tensor, device) for _ in range(args.iters))
            algbw = size / seconds / 1e9
            rows.append({"bytes": size, "impl": name, "seconds": seconds,
                         "algbw_gbps": algbw, "busbw_gbps": algbw * 2 * (n - 1) / n})
            if dist.get_rank() == 0:
                print(f"{size / 1024:>8.0f} KB  {name:<7}  {seconds * 1e3:8.3f} ms  "
                      f"algbw {algbw:6.3f} GB/s  busbw {rows[-1]['busbw_gbps']:6.3f} GB/s")
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"world_size": n, "backend": backend, "rows": rows}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
