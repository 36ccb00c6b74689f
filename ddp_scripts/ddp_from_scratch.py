"""DDP from scratch, in three steps, each checked against one big batch and torch's DDP.

    torchrun --standalone --nproc-per-node=4 ddp_scripts/ddp_from_scratch.py --variant naive overlap bucketed

Several variants are checked in turn; RESULT then holds {"variants": [...]}.
"""
import argparse
import json
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ddp_common import backend_and_device  # import before init_process_group
from ddp_step1_naive import NaiveDDP
from ddp_step2_overlap import OverlapDDP
from ddp_step3_bucketed import BucketedDDP


def make_model(seed, device, unused=False):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                torch.nn.Tanh(), torch.nn.Linear(64, 4))
    if unused:  # a parameter that forward never uses, so backward never gives it a gradient
        model.register_parameter("unused", torch.nn.Parameter(torch.zeros(3)))
    return model.to(device)


def train(model, batches, steps, before_step=lambda: None):
    """Train; return the final parameters and (start, end) of the last step's backward()."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        x, y = batches[step]
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        backward_start = time.perf_counter()
        loss.backward()
        backward_end = time.perf_counter()
        before_step()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()]), (backward_start, backward_end)


def check(variant, args, mine, global_batches, device, rank, world_size):
    """Train ours, one process on the whole batch, and torch's DDP; return rank 0's result."""
    # Ours. Each rank starts from different weights: the broadcast must fix that.
    model = make_model(seed=rank, device=device, unused=args.unused)
    ddp = {"naive": NaiveDDP, "overlap": OverlapDDP,
           "bucketed": lambda model: BucketedDDP(model, args.bucket_mb)}[variant](model)
    ours, (backward_start, backward_end) = train(model, mine, args.steps, before_step=ddp.finish_gradients)

    # One process, the whole batch.
    single, _ = train(make_model(seed=0, device=device), global_batches, args.steps)
    # torch's DDP, from the same per-rank starting weights.
    theirs, _ = train(DistributedDataParallel(make_model(seed=rank, device=device)), mine, args.steps)

    diffs = torch.stack([(ours - single).abs().max(), (ours - theirs).abs().max()])
    dist.all_reduce(diffs, op=dist.ReduceOp.MAX)  # the worst rank decides
    diff_single, diff_torch = diffs.tolist()
    if rank != 0:
        return None
    print(f"{variant}, {world_size} ranks: max |ours - one process| {diff_single:.0e}, |ours - DDP| {diff_torch:.0e}")
    result = {"variant": variant, "world_size": world_size,
              "matches_single_process": diff_single < 1e-5, "matches_torch_ddp": diff_torch < 1e-5,
              "max_abs_diff": max(diff_single, diff_torch), "diff_torch_ddp": diff_torch}
    if variant == "bucketed":
        result["buckets"] = len(ddp.buckets)
    else:  # when the last step's all-reduces started, in ms from the start of its backward()
        launches = [(t - backward_start) * 1e3 for t in ddp.launched_at if t >= backward_start]
        result.update(backward_ms=(backward_end - backward_start) * 1e3, allreduce_launch_ms=launches,
                      launched_during_backward=sum(t < (backward_end - backward_start) * 1e3 for t in launches))
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", choices=["naive", "overlap", "bucketed"], nargs="+", required=True)
    parser.add_argument("--bucket-mb", type=float, default=0.01)  # tiny model: several buckets
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-per-rank", type=int, default=8)
    parser.add_argument("--unused", action="store_true")
    args = parser.parse_args()

    backend, device = backend_and_device()
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    rank, world_size = dist.get_rank(), dist.get_world_size()

    # The same global batches on every rank; rank r trains on its slice of each.
    g = torch.Generator().manual_seed(0)
    n = args.batch_per_rank * world_size
    global_batches = [(torch.randn(n, 32, generator=g).to(device), torch.randn(n, 4, generator=g).to(device))
                      for _ in range(args.steps)]
    mine = [(x.chunk(world_size)[rank], y.chunk(world_size)[rank]) for x, y in global_batches]

    results = [check(variant, args, mine, global_batches, device, rank, world_size) for variant in args.variant]
    if rank == 0:
        print("RESULT " + json.dumps(results[0] if len(results) == 1 else {"variants": results}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
