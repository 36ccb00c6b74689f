"""Mixed precision under DDP: float32, bfloat16 autocast, and float16 autocast with a GradScaler, over several seeds.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/mixed_precision.py --seeds 0 1 2 --save amp.pt

autocast runs matrix products in 16 bits; parameters, gradients and DDP's all-reduce stay float32. float16 needs
a GradScaler: a step with an inf or a nan gradient is skipped and the scale halved. It checks the all-reduced
gradients, so every rank skips the same steps. The same code runs on GPUs (device "cuda") and on the CPU.
"""
import argparse
import importlib.util
import json
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_common import backend_and_device  # import before init_process_group

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def digits():
    """1792 of the 8x8 handwritten digits in the file scikit-learn ships: offline, no import."""
    sklearn_dir = importlib.util.find_spec("sklearn").submodule_search_locations[0]
    table = np.loadtxt(os.path.join(sklearn_dir, "datasets", "data", "digits.csv.gz"), delimiter=",")[:1792]
    return torch.tensor(table[:, :-1], dtype=torch.float32) / 16, torch.tensor(table[:, -1]).long()


def train(precision, seed, data, steps, init_scale, rank, world, device):
    torch.manual_seed(seed)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device),
                device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    # Only float16 needs the scaler; disabled, scale() returns the loss as it is and step() is optimizer.step().
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, enabled=precision == "fp16")
    x, y = data
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    per_rank, losses, scales = 32, [], []
    for step in range(steps):
        batch = order[(step * per_rank * world) % len(x):][:per_rank * world][rank::world]  # this rank's share
        with torch.autocast(device.type, dtype=DTYPES[precision], enabled=precision != "fp32"):
            loss = F.cross_entropy(model(x[batch].to(device)), y[batch].to(device))
        optimizer.zero_grad()
        scaler.scale(loss).backward()  # DDP all-reduces the (scaled) float32 gradients
        scaler.step(optimizer)  # unscale_, then step unless a gradient is inf/nan
        scaler.update()
        mean_loss = loss.detach().float()
        dist.all_reduce(mean_loss)  # the loss over all ranks' samples (lesson 04), for the curve
        losses.append(mean_loss.item() / world)
        scales.append(scaler.get_scale() if scaler.is_enabled() else 1.0)
    return model, optimizer, scaler, losses, scales


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--precisions", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--init-scale", type=float, default=2.0 ** 16, help="GradScaler's first scale (its default)")
    parser.add_argument("--save", default=None, help="a checkpoint of the last fp16 run: model, optimizer, scaler")
    args = parser.parse_args()
    backend, device = backend_and_device()
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    data = digits()
    curves, scales_agree, skipped = {}, True, {}
    for precision in args.precisions:
        curves[precision] = []
        for seed in args.seeds:
            model, optimizer, scaler, losses, scales = train(precision, seed, data, args.steps, args.init_scale,
                                                                  rank, world, device)
            curves[precision].append(losses)
            every_rank = [None] * world
            dist.all_gather_object(every_rank, scales)
            scales_agree &= all(s == every_rank[0] for s in every_rank)  # same skipped steps on every rank
            backoffs = sum(after < before for before, after in zip([args.init_scale] + scales, scales))
            skipped.setdefault(precision, []).append(backoffs if scaler.is_enabled() else 0)  # one per skipped step
        if precision == "fp16" and args.save and rank == 0:
            # The scaler's scale and growth tracker belong in the checkpoint: a resumed run without them starts
            # again at 65536, below or above the scale that worked: it skips steps, or regrows for 2000 steps a doubling.
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "scaler": scaler.state_dict()}, args.save)
    if rank == 0:
        print("RESULT " + json.dumps({"device": device.type, "world_size": world, "seeds": args.seeds,
                                      "loss_curves": curves, "skipped_steps": skipped,
                                      "scales_agree_across_ranks": scales_agree,
                                      "init_scale": args.init_scale, "last_scale": scales[-1]}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
