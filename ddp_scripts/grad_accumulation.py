"""Gradient accumulation under DDP: k micro-batches, one optimizer step, and when DDP all-reduces.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/grad_accumulation.py --accum-steps 4

Each rank runs k micro-batches of --micro-batch samples, then one optimizer step (a global batch of
ranks x k x micro-batch samples), seven ways (--modes), each from the same start:

  no_sync       the first k-1 micro-batches inside ddp.no_sync(), the last one outside: the pattern
  every         no no_sync: an all-reduce after every micro-batch
  nanogpt       ddp.require_backward_grad_sync = (last micro-batch), what no_sync() sets
  all_no_sync   every micro-batch inside no_sync(), the last one too (the post's loop)
  unscaled      like no_sync, but the loss is not divided by k
  no_sync_fwd   like no_sync, but only the forward inside no_sync()
  no_sync_bwd   like no_sync, but only the backward inside no_sync()

A comm hook counts DDP's all-reduces; the first step's gradient is compared with one process's big batch.
"""
import argparse
import contextlib
import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_common  # import before init_process_group (see ddp_common.py)

MODES = ["no_sync", "every", "nanogpt", "all_no_sync", "unscaled", "no_sync_fwd", "no_sync_bwd"]


def make_model():
    torch.manual_seed(0)  # the same start on every rank and in every mode
    return nn.Sequential(nn.Linear(16, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 4))


def global_batches(steps, world, k, micro):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(world * k * micro, 16, generator=g), torch.randn(world * k * micro, 4, generator=g))
            for _ in range(steps)]


def my_micro_batches(batch, rank, world, k, micro):
    """This rank's k micro-batches of the global batch: rank r takes its contiguous share."""
    x, y = batch
    mine = slice(rank * k * micro, (rank + 1) * k * micro)
    return list(zip(x[mine].split(micro), y[mine].split(micro)))


def clock(device):
    """perf_counter() once the GPU is done: backward() and NCCL calls return while the GPU still works."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def flat_grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def train(mode, batches, rank, world, k, micro, device):
    counter = {"all_reduces": 0}
    timeline = []  # "forward j", "backward j" and each "all-reduce", in the order they happen

    def counting_hook(group, bucket):  # DDP calls this once per bucket it all-reduces
        counter["all_reduces"] += 1
        timeline.append("all-reduce")  # inside backward: after the "backward j" it belongs to
        return allreduce_hook(group, bucket)  # the default all-reduce, unchanged

    ddp = DDP(make_model().to(device), device_ids=[device.index] if device.type == "cuda" else None)
    ddp.register_comm_hook(dist.group.WORLD, counting_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    first_grads, seconds = None, []
    for batch in batches:
        start = clock(device)
        micro_batches = my_micro_batches(batch, rank, world, k, micro)
        for j, (x, y) in enumerate(micro_batches):
            last = j == k - 1
            if mode == "nanogpt":  # exactly what no_sync() toggles, set by hand
                ddp.require_backward_grad_sync = last
            skip_sync = (not last and mode in ("no_sync", "unscaled", "no_sync_fwd", "no_sync_bwd")
                         or mode == "all_no_sync")
            # Forward and backward each get their own context, so that the last two modes can leave one of them
            # outside; for the other modes both are inside, the same as one `with ddp.no_sync():` around both.
            timeline.append(f"forward {j}")
            with ddp.no_sync() if skip_sync and mode != "no_sync_bwd" else contextlib.nullcontext():
                loss = F.mse_loss(ddp(x.to(device)), y.to(device))
            timeline.append(f"backward {j}")
            with ddp.no_sync() if skip_sync and mode != "no_sync_fwd" else contextlib.nullcontext():
                (loss if mode == "unscaled" else loss / k).backward()  # 1/k: the mean over k micro-batches
        if first_grads is None:
            first_grads, first_step = flat_grads(ddp.module).clone(), list(timeline)
        optimizer.step()
        optimizer.zero_grad()
        seconds.append(clock(device) - start)
    params = torch.cat([p.detach().flatten() for p in ddp.module.parameters()])
    spread = params.clone()
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    lowest = params.clone()
    dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
    return first_grads, {"allreduces_per_step": counter["all_reduces"] / len(batches),
                         "params_spread_across_ranks": (spread - lowest).abs().max().item(),
                         "step_seconds": min(seconds),  # the minimum: the step with the least noise in it
                         "first_step_timeline": first_step}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--accum-steps", default="4", help="k micro-batches per optimizer step; 1,2,4 runs each")
    parser.add_argument("--micro-batch", type=int, default=8, help="samples per micro-batch, per rank")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps")
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    modes = args.modes.split(",")
    try:
        all_k = [int(k) for k in args.accum_steps.split(",")]
    except ValueError:
        sys.exit(f"--accum-steps must be whole numbers, got {args.accum_steps!r}")
    if min(all_k) < 1:
        sys.exit(f"--accum-steps must be >= 1 (the micro-batches per optimizer step), got {args.accum_steps}")
    if args.micro_batch < 1 or args.steps < 1 or not set(modes) <= set(MODES):
        sys.exit(f"--micro-batch and --steps must be >= 1, --modes a comma-separated subset of {MODES}")
    backend, device = ddp_common.backend_and_device()
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    results = [run_checks(k, modes, args, rank, world, device) for k in all_k]
    if rank == 0:
        result = dict(results[-1])  # the last k's keys at the top; every k's under per_accum_steps
        if len(results) > 1:
            result["per_accum_steps"] = {str(r["accum_steps"]): r for r in results}
        print("RESULT " + json.dumps(result))
    dist.destroy_process_group()


def run_checks(k, modes, args, rank, world, device):
    batches = global_batches(args.steps, world, k, args.micro_batch)

    reference = make_model()  # one process, the whole first global batch at once
    F.mse_loss(reference(batches[0][0]), batches[0][1]).backward()
    big_batch_grads = flat_grads(reference)

    train("every", batches[:1], rank, world, k, args.micro_batch, device)  # warm-up, so no mode pays for it
    table = {}
    for mode in modes:
        grads, row = train(mode, batches, rank, world, k, args.micro_batch, device)
        row["grad_diff_from_big_batch"] = (grads.cpu() - big_batch_grads).abs().max().item()
        row["grad_norm_ratio"] = (grads.norm() / big_batch_grads.norm()).item()
        table[mode] = row
    result = {"world_size": world, "accum_steps": k, "global_batch": world * k * args.micro_batch, "modes": table}
    if "no_sync" in table:
        result.update(matches_big_batch=table["no_sync"]["grad_diff_from_big_batch"] < 1e-5,
                      allreduces_per_step_with_no_sync=table["no_sync"]["allreduces_per_step"],
                      params_agree_across_ranks=table["no_sync"]["params_spread_across_ranks"] == 0)
    if "every" in table:
        result["allreduces_per_step_without_no_sync"] = table["every"]["allreduces_per_step"]
    return result


if __name__ == "__main__":
    main()
