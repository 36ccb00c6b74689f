"""Where each rank's step time goes: one DDP model trained in several cases, each with one classic slowdown planted,
every rank profiled by torch.profiler into a Chrome trace of its own (lesson 06b).

    torchrun --nproc-per-node=2 ddp_scripts/profile_ranks.py --trace-dir traces --cases clean straggler
    torchrun --nproc-per-node=2 ddp_scripts/profile_ranks.py --cases straggler   # no profiler: for the doctor

Each case writes TRACE_DIR/<case>/rank<R>.json, open it in https://ui.perfetto.dev or chrome://tracing.
"""
import argparse
import io
import json
import os
import socket
import time

import numpy as np
import torch
import torch.distributed as dist
from PIL import Image
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ddp_common import backend_and_device  # import before init_process_group

CASES = {
    "clean": "DDP's buckets, data decoded once ahead, one thread a rank, 32 samples a rank a step",
    "straggler": "rank 1 takes 150 ms longer a step (a sleep stands in for a slower device or a busier node)",
    "loader": "every batch decoded from PNG in the training process (num_workers=0)",
    "loader-workers": "the same decoding in a DataLoader worker process of each rank",
    "by-hand": "gradients all-reduced by hand after backward: no overlap with it",
    "threads": "every rank uses as many intra-op threads as the machine has cores",
    "tiny-batch": "2 samples a rank a step: little compute for the same communication",
}


def photo(index):
    """A smooth random 256x256 RGB image, as a photo would be: the same for an index on every rank."""
    coarse = np.random.default_rng(index).integers(0, 256, (20, 20, 3), dtype=np.uint8)
    return Image.fromarray(coarse).resize((256, 256), Image.BILINEAR)


def features(image):
    """What the model reads: the image shrunk to 32x32 grey, 1024 numbers in [0, 1]."""
    x = torch.from_numpy(np.asarray(image.convert("L").resize((32, 32)), dtype=np.float32) / 255.0).flatten()
    return x, x.sum().unsqueeze(0)


class PngImages(Dataset):
    """The images kept as PNG bytes, as on disk; each item is decoded, then shrunk."""

    def __init__(self, count):
        self.png = []
        for index in range(count):
            buffer = io.BytesIO()
            photo(index).save(buffer, format="PNG")
            self.png.append(buffer.getvalue())

    def __len__(self):
        return len(self.png)

    def __getitem__(self, index):
        return features(Image.open(io.BytesIO(self.png[index])))


def decoded(count):
    """The same samples decoded once, ahead of training (PNG is lossless: the same numbers)."""
    xs, ys = zip(*(features(photo(index)) for index in range(count)))
    return torch.utils.data.TensorDataset(torch.stack(xs), torch.stack(ys))


def thread_metadata(threads):
    """What a trace cannot show by itself: this rank's intra-op threads, the cores it may use, its host."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []  # Linux only
    return json.dumps({"threads": threads, "cores": len(cpus) or os.cpu_count(), "cpus": cpus,
                       "host": socket.gethostname()})


def run_case(case, args, rank, device, data):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU())
                                  for _ in range(args.layers)], torch.nn.Linear(1024, 1)).to(device)
    by_hand = case == "by-hand"
    ddp = model if by_hand else DDP(model, bucket_cap_mb=args.bucket_mb)
    if by_hand:  # what DDP does at construction: every rank starts from rank 0's weights
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    batch = 2 if case == "tiny-batch" else args.batch
    loader = DataLoader(data, batch_size=batch, sampler=DistributedSampler(data, shuffle=True, seed=0),
                        num_workers=1 if case == "loader-workers" else 0, drop_last=True,
                        persistent_workers=case == "loader-workers")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = cores if case == "threads" else torch.get_num_threads()
    before, profiler = torch.get_num_threads(), None
    torch.set_num_threads(threads)
    if args.trace_dir:
        out = os.path.join(args.trace_dir, case)
        os.makedirs(out, exist_ok=True)
        activities = [torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
        profiler = torch.profiler.profile(
            activities=activities,
            # leave out 2 steps (the first, and the second, where DDP rebuilds its buckets), warm up 1, record the rest
            schedule=torch.profiler.schedule(wait=2, warmup=1, active=args.steps - 3, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(os.path.join(out, f"rank{rank}.json")))
        profiler.preset_metadata_json("threads_and_cores", thread_metadata(threads))  # into every trace it writes
        profiler.start()
    ends = [time.perf_counter()]
    for step, (x, y) in zip(range(args.steps), loader):
        if case == "straggler" and rank == 1:
            time.sleep(0.150)
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        if by_hand:  # one gradient at a time, after the whole backward
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
        optimizer.step()
        if profiler:
            profiler.step()
        ends.append(time.perf_counter())
    if profiler:
        profiler.stop()
    torch.set_num_threads(before)
    steps = sorted(b - a for a, b in zip(ends[3:], ends[4:]))  # each step, its batch's loading included
    return steps[len(steps) // 2] * 1e3  # the median, past the first three


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", nargs="+", default=["clean"], choices=list(CASES))
    parser.add_argument("--trace-dir", help="profile every rank, one trace per case and rank here")
    parser.add_argument("--steps", type=int, default=10, help="steps a case (the profiler records the last steps-3)")
    parser.add_argument("--batch", type=int, default=32, help="samples a rank a step")
    parser.add_argument("--layers", type=int, default=4, help="1024x1024 layers: 4 MB of gradients each")
    parser.add_argument("--bucket-mb", type=float, default=4.0, help="DDP's bucket_cap_mb")
    args = parser.parse_args()
    if args.steps < 4:
        parser.error("--steps: at least 4 (2 left out, 1 to warm the profiler up, then the recorded ones)")

    backend, device = backend_and_device()
    dist.init_process_group(backend)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    samples = world_size * max(args.batch, 2) * args.steps  # the same on every rank; each reads its own share
    images = PngImages(samples) if any(case.startswith("loader") for case in args.cases) else None
    ready = decoded(samples)
    medians = {case: run_case(case, args, rank, device, images if case.startswith("loader") else ready)
               for case in args.cases}
    gathered = [None] * world_size
    dist.all_gather_object(gathered, medians)
    if rank == 0:
        print("RESULT " + json.dumps({"world_size": world_size, "cases": args.cases,
                                      "median_step_ms": {c: [round(g[c], 1) for g in gathered] for c in args.cases}}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
