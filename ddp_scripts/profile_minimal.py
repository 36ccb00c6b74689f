"""The minimal pattern: profile a few steps of every rank with torch.profiler, one Chrome trace per rank.

    torchrun --nproc-per-node=2 ddp_scripts/profile_minimal.py --trace-dir traces
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, schedule

from ddp_common import backend_and_device  # import before init_process_group

parser = argparse.ArgumentParser()
parser.add_argument("--trace-dir", default="traces")
args = parser.parse_args()
backend, device = backend_and_device()
dist.init_process_group(backend)
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)).to(device))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
os.makedirs(args.trace_dir, exist_ok=True)
activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=3, repeat=1),  # ProfilerStep#2-#4
             on_trace_ready=lambda p: p.export_chrome_trace(f"{args.trace_dir}/rank{rank}.json")) as profiler:
    for step in range(5):
        x = torch.randn(64, 1024, device=device)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        profiler.step()  # closes this step's span (ProfilerStep#k) in the trace
if rank == 0:
    print(profiler.key_averages().table(sort_by="cpu_time_total", row_limit=6))
dist.destroy_process_group()
