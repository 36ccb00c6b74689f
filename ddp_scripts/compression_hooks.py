"""DDP's gradient-compression hooks against the plain all-reduce: bytes, time, error, and whether it still learns.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/compression_hooks.py --epochs 3

Lesson 04's model and data, trained once per hook from the same start (seed 0 sets the start and the sample
order). Every hook, the plain one included, hands its tensors to dist.all_reduce; a wrapper around it counts
the bytes. At step 4 (after PowerSGD's warm-up) each rank also computes the exact averaged gradient, to measure
each hook's error. With --plain-seeds the plain all-reduce is trained again at those seeds: how far the final loss
moves from one seed to the next, the yardstick for the differences between hooks (lesson 09b uses 1,2,3).
"""
import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset

import ddp_common  # import before init_process_group (see ddp_common.py)
from train_ddp import SmallCNN, digits  # lesson 04's model and data

PROBE_STEP = 4  # PowerSGD's first start_powerSGD_iter steps are plain all-reduces: look after them
POWERSGD_RANK, MIN_COMPRESSION_RATE = 1, 2  # rank-1 approximations; 2 is torch's default rate
SENT = {"bytes": 0}
_all_reduce = dist.all_reduce


def counting_all_reduce(tensor, *args, **kwargs):
    SENT["bytes"] += tensor.numel() * tensor.element_size()
    return _all_reduce(tensor, *args, **kwargs)


dist.all_reduce = counting_all_reduce  # the hooks call dist.all_reduce: every byte they send passes here


def clock(device):
    """perf_counter() once the GPU is done: backward() and NCCL calls return while the GPU still works."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def powersgd_elements(model, approximation_rank, min_compression_rate):
    """The elements PowerSGD all-reduces per step, by our reading of powerSGD_hook.py: each gradient is viewed as
    an n x m matrix (n = its first dimension) and compressed to P (n x r) and Q (m x r) only when
    (n + m) * r * min_compression_rate < n * m; the others (the biases: n x 1) go uncompressed."""
    plan = {"uncompressed": 0, "P": 0, "Q": 0}
    for p in model.parameters():
        n, m = p.shape[0], p.numel() // p.shape[0]
        r = min(n, m, approximation_rank)
        if (n + m) * r * min_compression_rate < n * m:
            plan["P"], plan["Q"] = plan["P"] + n * r, plan["Q"] + m * r
        else:
            plan["uncompressed"] += n * m
    return plan


def register(ddp, name):
    if name == "none":  # torch's default all-reduce, as a hook, so that it is counted like the others
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif name == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    else:  # rank-1 approximations with error feedback and warm start, which need start_powerSGD_iter > 1
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=POWERSGD_RANK,
                                            start_powerSGD_iter=2, min_compression_rate=MIN_COMPRESSION_RATE)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)


def train(name, seed, train_set, rank, world, device, epochs, batch, lr):
    torch.manual_seed(seed)
    ddp = DDP(SmallCNN().to(device), device_ids=[device.index] if device.type == "cuda" else None)
    register(ddp, name)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=seed)
    loader = DataLoader(train_set, batch_size=batch, sampler=sampler)
    step, step_bytes, seconds, error = 0, [], [], None
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            if step == PROBE_STEP:  # the exact averaged gradient at these same parameters, without DDP
                exact = torch.autograd.grad(F.cross_entropy(ddp.module(x), y), list(ddp.module.parameters()))
                exact = torch.cat([g.flatten() for g in exact])
                _all_reduce(exact)
                exact /= world
            SENT["bytes"], start = 0, clock(device)
            loss = F.cross_entropy(ddp(x), y)
            optimizer.zero_grad()
            loss.backward()
            if step == PROBE_STEP:
                sent = torch.cat([p.grad.flatten() for p in ddp.module.parameters()])
                error = ((sent - exact).norm() / exact.norm()).item()
            optimizer.step()
            seconds.append(clock(device) - start)
            step_bytes.append(SENT["bytes"])
            step += 1
    totals = torch.zeros(2, device=device)  # the final model's loss over the whole training set
    with torch.no_grad():
        for x, y in DataLoader(Subset(train_set, range(rank, len(train_set), world)), batch_size=500):
            x, y = x.to(device), y.to(device)
            totals += torch.stack([F.cross_entropy(ddp.module(x), y, reduction="sum"),
                                   torch.full((), float(len(y)), device=device)])
    _all_reduce(totals)
    return {"bytes_per_step": step_bytes[-1], "step_seconds": sorted(seconds)[len(seconds) // 2],
            "relative_grad_error": error, "final_loss": (totals[0] / totals[1]).item(), "steps": step}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hooks", default="none,fp16,bf16,powersgd")
    parser.add_argument("--plain-seeds", default="", help="seeds to train the plain all-reduce with again, e.g. 1,2,3")
    args = parser.parse_args()
    backend, device = ddp_common.backend_and_device()
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    train_set, _ = digits(0)
    rows = {}
    for name in args.hooks.split(","):
        rows[name] = train(name, 0, train_set, rank, world, device, args.epochs, args.batch_size, args.lr)
        if rank == 0:
            r = rows[name]
            print(f"{name:>9}: {r['bytes_per_step']:>7,} bytes sent per step per rank, gradient error at step "
                  f"{PROBE_STEP} {r['relative_grad_error']:.1e}, final train-set loss {r['final_loss']:.2f}")
    plain_seeds = [int(seed) for seed in args.plain_seeds.split(",") if seed]
    plain_losses = [train("none", seed, train_set, rank, world, device, args.epochs, args.batch_size, args.lr)
                    ["final_loss"] for seed in plain_seeds]
    if rank == 0:
        if plain_seeds:
            print(f"plain all-reduce, seeds {plain_seeds}: final train-set loss "
                  + ", ".join(f"{loss:.2f}" for loss in plain_losses))
        print("RESULT " + json.dumps({"world_size": world, "hooks": rows,
                                      "plain_final_loss_by_seed": dict(zip(plain_seeds, plain_losses)),
                                      "powersgd_elements": powersgd_elements(SmallCNN(), POWERSGD_RANK, MIN_COMPRESSION_RATE)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
