"""Benchmark: step time of our three DDPs and torch's, and a bucket-size sweep.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/bench_ddp_variants.py

8 layers of 1024x1024 (34 MB of gradients): an all-reduce costs about a forward and backward.
Step time: the median over --steps steps after 2 warm-up steps, on the slowest rank.
"""
import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ddp_common import backend_and_device  # import before init_process_group
from ddp_step1_naive import NaiveDDP
from ddp_step2_overlap import OverlapDDP
from ddp_step3_bucketed import BucketedDDP


def make_model(device, width=1024, layers=8):
    torch.manual_seed(0)
    blocks = [m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]
    return torch.nn.Sequential(*blocks).to(device)


def step_ms(model, finish_gradients, device, steps, warmup=2, batch=32):
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, 1024, device=device)
    times = []
    for i in range(warmup + steps):
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        model(x).square().mean().backward()
        finish_gradients()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if i >= warmup:
            times.append(elapsed.item() * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bucket-mb", type=float, nargs="+", default=[0.25, 25, 100])
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    backend, device = backend_and_device()
    dist.init_process_group(backend)
    rows = []

    def measure(variant, bucket_mb, model, finish_gradients):
        ms = step_ms(model, finish_gradients, device, args.steps)
        rows.append({"variant": variant, "bucket_mb": bucket_mb, "step_ms": ms})
        if dist.get_rank() == 0:
            print(f"{variant} (bucket {bucket_mb} MB): {ms:.1f} ms/step")

    for variant, Ours in (("naive", NaiveDDP), ("overlap", OverlapDDP)):
        model = make_model(device)
        measure(variant, None, model, Ours(model).finish_gradients)
    for mb in args.bucket_mb:
        model = make_model(device)
        measure("bucketed", mb, model, BucketedDDP(model, mb).finish_gradients)
        measure("torch_ddp", mb, DistributedDataParallel(make_model(device), bucket_cap_mb=mb), lambda: None)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"world_size": dist.get_world_size(), "rows": rows}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
