"""The hand-made SyncBatchNorm (hand_syncbn.py) checked against BatchNorm on the whole batch, on every rank's slice.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/sync_batchnorm.py --batch-sizes 3,5 0,4

Each --batch-sizes list (one size per rank) is one check. On GPUs (nccl) torch's own nn.SyncBatchNorm goes
through the same checks, with the same tolerances.
"""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import ddp_common  # import before init_process_group (see ddp_common.py)
from hand_syncbn import ALL_REDUCES, HandSyncBatchNorm2d

TOLERANCE = {"forward": 1e-5, "input_grad": 1e-5, "param_grad": 1e-4,  # parameter gradients are sums over every
             "running_stats": 1e-5, "num_batches_tracked": 0}           # sample: larger numbers, so 1e-4


def check(sizes, rank, device, synced_bn=HandSyncBatchNorm2d, momentum=0.1):
    """A synced BN (ours, or torch's on GPUs) on each rank's slice against nn.BatchNorm2d on the concatenated batch:
    one training step (forward, backward), then a second forward on other data (the running statistics again)."""
    world = len(sizes)
    g = torch.Generator().manual_seed(0)
    x_all = torch.randn(sum(sizes), 3, 4, 4, generator=g) * 3 + 1
    target = torch.randn(sum(sizes), 3, 4, 4, generator=g)  # the loss is sum(out * target): a sum over samples
    x2_all = torch.randn(sum(sizes), 3, 4, 4, generator=g) - 2
    start = sum(sizes[:rank])
    mine = slice(start, start + sizes[rank])

    reference = nn.BatchNorm2d(3, momentum=momentum)
    ref_x = x_all.clone().requires_grad_()
    ref_out = reference(ref_x)
    (ref_out * target).sum().backward()
    reference(x2_all)

    ours = synced_bn(3, momentum=momentum).to(device)
    before = dict(ALL_REDUCES)
    x = x_all[mine].clone().to(device).requires_grad_()
    out = ours(x)
    (out * target[mine].to(device)).sum().backward()
    allreduces = {phase: ALL_REDUCES[phase] - before[phase] for phase in ("forward", "backward")}  # in one step
    ours(x2_all[mine].to(device))
    # torch's nn.SyncBatchNorm leaves .grad None on a rank without samples (nn/modules/_functions.py): a zero share
    param_grads = torch.cat([p.grad if p.grad is not None else torch.zeros_like(p) for p in (ours.weight, ours.bias)])
    dist.all_reduce(param_grads)  # the ranks' shares, summed: the whole batch's

    diffs = torch.tensor([
        (out.cpu() - ref_out[mine]).abs().max().item() if sizes[rank] else 0.0,
        (x.grad.cpu() - ref_x.grad[mine]).abs().max().item() if sizes[rank] else 0.0,
        (param_grads.cpu() - torch.cat([reference.weight.grad, reference.bias.grad])).abs().max().item(),
        max((ours.running_mean.cpu() - reference.running_mean).abs().max().item(),
            (ours.running_var.cpu() - reference.running_var).abs().max().item()),
        abs(ours.num_batches_tracked.item() - reference.num_batches_tracked.item()),
        # the control: plain BatchNorm2d on this rank's slice alone, what DDP does without SyncBatchNorm
        (nn.BatchNorm2d(3)(x_all[mine]) - ref_out[mine]).abs().max().item() if sizes[rank] > 1 else 0.0],
        dtype=torch.float64, device=device)
    dist.all_reduce(diffs, op=dist.ReduceOp.MAX)  # the worst rank decides
    everyone = [None] * world
    dist.all_gather_object(everyone, x_all[mine].mean(dim=(0, 2, 3))[0].item() if sizes[rank] else None)
    return {"max_diff": dict(zip([*TOLERANCE, "per_rank_bn_forward"], diffs.tolist())), "allreduces": allreduces,
            "channel0_mean_per_rank": everyone, "channel0_mean_global": x_all.mean(dim=(0, 2, 3))[0].item()}


def verdicts(max_diff):
    return {name: max_diff[name] <= tolerance for name, tolerance in TOLERANCE.items()}


def checked(sizes, rank, device, momentum):
    """One check of ours, its verdicts; on GPUs torch's nn.SyncBatchNorm too."""
    ours = check(sizes, rank, device, momentum=momentum)
    max_diff, matches = ours["max_diff"], verdicts(ours["max_diff"])
    result = {"batch_sizes": sizes,
              "forward_matches": matches["forward"], "input_grad_matches": matches["input_grad"],
              "param_grad_matches": matches["param_grad"], "running_stats_match": matches["running_stats"],
              "num_batches_tracked_matches": matches["num_batches_tracked"],
              "per_rank_bn_matches": max_diff["per_rank_bn_forward"] < TOLERANCE["forward"], **ours}
    if device.type == "cuda":  # the real nn.SyncBatchNorm, through the same checks and tolerances
        torch_diff = check(sizes, rank, device, synced_bn=nn.SyncBatchNorm, momentum=momentum)["max_diff"]
        result["torch_syncbn_max_diff"] = {name: torch_diff[name] for name in TOLERANCE}
        result["torch_syncbn_matches"] = all(verdicts(torch_diff).values())
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-sizes", nargs="+", default=None, help="per rank, comma-separated, e.g. 3,5 0,4")
    parser.add_argument("--momentum", default=0.1, type=lambda s: None if s == "none" else float(s),
                        help="BatchNorm's momentum, or none: the running statistics average every batch")
    args = parser.parse_args()
    backend, device = ddp_common.backend_and_device()
    world = int(os.environ.get("WORLD_SIZE", 1))
    size_lists = []
    for text in args.batch_sizes or [",".join(["4"] * world)]:
        try:
            sizes = [int(s) for s in text.split(",")]
        except ValueError:
            sys.exit(f"--batch-sizes must be whole numbers separated by commas, got {text!r}")
        if len(sizes) != world or min(sizes) < 0:
            sys.exit(f"--batch-sizes needs one size >= 0 per rank: {world} ranks, got {text!r}")
        if sum(sizes) == 0:
            sys.exit("--batch-sizes are all 0: BatchNorm needs more than 1 value per channel when training")
        size_lists.append(sizes)
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    rank = dist.get_rank()
    try:  # torch's own module, on this machine, in training mode with a process group
        nn.SyncBatchNorm(3).to(device)(torch.randn(2, 3, 4, 4, device=device))
        refused = None
    except (ValueError, RuntimeError) as e:
        refused = str(e).splitlines()[0]
    result = {"world_size": dist.get_world_size(), "momentum": args.momentum, "torch_syncbn_on_this_device": refused,
              "checks": [checked(sizes, rank, device, args.momentum) for sizes in size_lists]}
    if rank == 0:
        print("RESULT " + json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
