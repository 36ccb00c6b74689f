"""Where the clip goes with no_sync accumulation and a GradScaler, checked against one process.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/clip_and_accumulate.py --accum-steps 1 3 --clip 0.5

after_sync (right): K-1 micro-batches inside no_sync(), the last outside (one all-reduce), then unscale_ and
clip_grad_norm_ on the synced gradient. before_sync (wrong): every micro-batch inside no_sync(), clip the local
gradient, then average by hand. Reference: one process, a plain copy of the model, the whole global batch.
--accum-steps and --clip take several values: every pair runs.
"""
import argparse
import contextlib
import copy
import importlib.util
import itertools
import json
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_common import backend_and_device  # import before init_process_group

TOLERANCE = 1e-5  # float32: the ranks' sums and one process's sum add in different orders


def digits():
    """1792 of the 8x8 handwritten digits in the file scikit-learn ships: offline, no import."""
    sklearn_dir = importlib.util.find_spec("sklearn").submodule_search_locations[0]
    table = np.loadtxt(os.path.join(sklearn_dir, "datasets", "data", "digits.csv.gz"), delimiter=",")[:1792]
    return torch.tensor(table[:, :-1], dtype=torch.float32) / 16, torch.tensor(table[:, -1]).long()


def make_model():
    torch.manual_seed(0)  # the same start on every rank and for the reference
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def global_batches(data, steps, size):
    order = torch.randperm(len(data[0]), generator=torch.Generator().manual_seed(1))
    return [(data[0][order[s * size:(s + 1) * size]], data[1][order[s * size:(s + 1) * size]]) for s in range(steps)]


def train_ddp(batches, k, clip, placement, rank, world, device):
    """Returns (the norm clip_grad_norm_ returned at the last step, the trained parameters as one vector)."""
    ddp = DDP(make_model().to(device), device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    # In float32 the scaler only multiplies by 2^10 and divides again (exact): the result must equal the reference.
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0 ** 10)
    for x, y in batches:
        share = len(x) // world  # rank r takes its contiguous share of the global batch, in k micro-batches
        micro_batches = zip(x[rank * share:(rank + 1) * share].chunk(k), y[rank * share:(rank + 1) * share].chunk(k))
        for j, (xm, ym) in enumerate(micro_batches):
            sync = j == k - 1 and placement == "after_sync"  # the wrong placement never lets DDP sync
            with contextlib.nullcontext() if sync else ddp.no_sync():
                loss = F.cross_entropy(ddp(xm.to(device)), ym.to(device)) / k  # / k: the mean over the k micro-batches
                scaler.scale(loss).backward()  # every micro-batch's backward is scaled
        scaler.unscale_(optimizer)  # once, before the clip: the clip must see the true gradient
        norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), clip)
        if placement == "before_sync":  # the local gradient was clipped; now average what is left, by hand
            for p in ddp.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        scaler.step(optimizer)  # skips the step if unscale_ found an inf or a nan
        scaler.update()
        optimizer.zero_grad()
    params = torch.cat([p.detach().flatten() for p in ddp.module.parameters()]).cpu()
    return norm.item(), params


def train_reference(batches, clip):
    """One process, a plain copy of the model, the whole global batch at once, the same clip and optimizer."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    norms = []
    for x, y in batches:
        F.cross_entropy(model(x), y).backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item())
        optimizer.step()
        optimizer.zero_grad()
    return norms, torch.cat([p.detach().flatten() for p in model.parameters()])


def one_case(data, k, clip, steps, micro, rank, world, device):
    batches = global_batches(data, steps, world * k * micro)
    ref_norms, ref_params = train_reference(batches, clip)
    case = {"accum_steps": k, "clip": clip, "world_size": world, "tolerance": TOLERANCE,
            "clipping_active": max(ref_norms) > clip}  # a norm above the limit at some step: the clip acted
    for placement in ("after_sync", "before_sync"):
        norm, params = train_ddp(batches, k, clip, placement, rank, world, device)
        norms = [None] * world
        dist.all_gather_object(norms, norm)  # each rank's clip_grad_norm_ result at the last step
        diff = (params - ref_params).abs().max().item()
        if placement == "after_sync":
            case.update(grad_norm_per_rank=norms, reference_norm=ref_norms[-1],
                        norms_equal=all(abs(n - norms[0]) <= TOLERANCE * norms[0] for n in norms),
                        max_param_diff=diff, matches_single_process=diff <= TOLERANCE)
        else:
            case.update(grad_norm_per_rank_before_sync=norms, max_param_diff_before_sync=diff,
                        clip_before_sync_matches=diff <= TOLERANCE)
    return case


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--accum-steps", type=int, nargs="+", default=[3], help="K micro-batches per step; several: each")
    parser.add_argument("--clip", type=float, nargs="+", default=[0.5], help="max_norm of clip_grad_norm_; several: each")
    parser.add_argument("--micro-batch", type=int, default=8, help="samples per micro-batch, per rank")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps")
    args = parser.parse_args()
    if min(args.accum_steps) < 1 or min(args.clip) <= 0 or args.micro_batch < 1 or args.steps < 1:
        parser.error("--accum-steps, --micro-batch and --steps must be >= 1, --clip > 0")
    backend, device = backend_and_device()
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world * max(args.accum_steps) * args.micro_batch * args.steps > 1792:
        parser.error("more samples than the 1792 digits: fewer --steps or a smaller --micro-batch")
    data = digits()
    cases = [one_case(data, k, clip, args.steps, args.micro_batch, rank, world, device)
             for k, clip in itertools.product(args.accum_steps, args.clip)]
    if rank == 0:
        result = dict(cases[-1])  # the last case's keys at the top, every case under "cases"
        result["cases"] = cases
        print("RESULT " + json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
