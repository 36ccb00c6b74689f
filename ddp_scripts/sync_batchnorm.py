"""Synchronized BatchNorm built by hand, checked against BatchNorm on the whole batch; then a model where it matters.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/sync_batchnorm.py --batch-sizes 3,5

nn.SyncBatchNorm refuses CPU tensors, so this is the same algorithm as an autograd.Function:
forward all-reduces (count, sum, sum of squares) per channel, once; backward all-reduces the two
sums BatchNorm's gradient needs (sum of dy, sum of dy * x_hat), once. Per-rank batch sizes may differ.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

import ddp_common  # import before init_process_group (see ddp_common.py)

ALL_REDUCES = {"forward": 0, "backward": 0, "seconds": 0.0}  # what synchronizing costs, counted and timed


def timed_all_reduce(tensor, phase):
    start = time.perf_counter()
    dist.all_reduce(tensor)
    ALL_REDUCES["seconds"] += time.perf_counter() - start
    ALL_REDUCES[phase] += 1


class SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum):
        dims = [0] + list(range(2, x.dim()))  # every dimension but the channels
        # float64 for the sums: sum of squares minus squared sum loses digits in float32
        local = torch.cat([torch.full((1,), x.numel() / x.shape[1], dtype=torch.float64, device=x.device),
                           x.double().sum(dims), (x.double() ** 2).sum(dims)])
        timed_all_reduce(local, "forward")  # one all-reduce: count, sum and sum of squares of every rank
        count, total, squares = local[0], local[1:1 + x.shape[1]], local[1 + x.shape[1]:]
        if count <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got {int(count)} over all ranks")
        mean, var = total / count, squares / count - (total / count) ** 2  # biased variance: used to normalize
        with torch.no_grad():  # running statistics: torch keeps the *unbiased* variance
            running_mean.mul_(1 - momentum).add_(momentum * mean.to(running_mean.dtype))
            running_var.mul_(1 - momentum).add_(momentum * (var * count / (count - 1)).to(running_var.dtype))
        shape = [1, -1] + [1] * (x.dim() - 2)
        invstd = (var + eps).rsqrt().to(x.dtype)
        x_hat = (x - mean.to(x.dtype).view(shape)) * invstd.view(shape)
        ctx.save_for_backward(x_hat, weight, invstd)
        ctx.count = count
        return x_hat * weight.view(shape) + bias.view(shape)

    @staticmethod
    def backward(ctx, dy):
        x_hat, weight, invstd = ctx.saved_tensors
        dims = [0] + list(range(2, dy.dim()))
        shape = [1, -1] + [1] * (dy.dim() - 2)
        local_dy, local_dy_xhat = dy.sum(dims), (dy * x_hat).sum(dims)
        sums = torch.cat([local_dy, local_dy_xhat])
        timed_all_reduce(sums, "backward")  # one all-reduce: the two sums over every rank's samples
        sum_dy, sum_dy_xhat = sums.split(dy.shape[1])
        dx = (weight * invstd).view(shape) * (dy - (sum_dy.view(shape) + x_hat * sum_dy_xhat.view(shape)) / ctx.count)
        # This rank's share of the weight and bias gradients; DDP all-reduces them like any other parameter's.
        return dx, local_dy_xhat, local_dy, None, None, None, None


class HandSyncBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics are the whole batch's, over every rank. Eval: running stats, no talk."""

    def forward(self, x):
        if not self.training:
            return super().forward(x)
        return SyncBatchNormFunction.apply(x, self.weight, self.bias, self.running_mean, self.running_var,
                                           self.eps, self.momentum)


def convert_to_hand_sync(module):
    """What nn.SyncBatchNorm.convert_sync_batchnorm does: swap every BatchNorm2d, keeping its weights and stats."""
    if isinstance(module, nn.BatchNorm2d):
        synced = HandSyncBatchNorm2d(module.num_features, module.eps, module.momentum)
        synced.load_state_dict(module.state_dict())
        return synced
    for name, child in module.named_children():
        module.add_module(name, convert_to_hand_sync(child))
    return module


def check(sizes, rank, device, synced_bn=HandSyncBatchNorm2d):
    """A synced BN (ours, or torch's on GPUs) on each rank's slice against nn.BatchNorm2d on the concatenated batch."""
    world = len(sizes)
    g = torch.Generator().manual_seed(0)
    x_all = torch.randn(sum(sizes), 3, 4, 4, generator=g) * 3 + 1
    target = torch.randn(sum(sizes), 3, 4, 4, generator=g)  # the loss is sum(out * target): a sum over samples
    start = sum(sizes[:rank])
    mine = slice(start, start + sizes[rank])

    reference = nn.BatchNorm2d(3)
    ref_x = x_all.clone().requires_grad_()
    ref_out = reference(ref_x)
    (ref_out * target).sum().backward()

    ours = synced_bn(3).to(device)
    x = x_all[mine].clone().to(device).requires_grad_()
    out = ours(x)
    (out * target[mine].to(device)).sum().backward()
    param_grads = torch.cat([ours.weight.grad, ours.bias.grad])
    dist.all_reduce(param_grads)  # the ranks' shares, summed: the whole batch's

    diffs = torch.tensor([
        (out.cpu() - ref_out[mine]).abs().max().item() if sizes[rank] else 0.0,
        (x.grad.cpu() - ref_x.grad[mine]).abs().max().item() if sizes[rank] else 0.0,
        (param_grads.cpu() - torch.cat([reference.weight.grad, reference.bias.grad])).abs().max().item(),
        max((ours.running_mean.cpu() - reference.running_mean).abs().max().item(),
            (ours.running_var.cpu() - reference.running_var).abs().max().item()),
        # the control: plain BatchNorm2d on this rank's slice alone, what DDP does without SyncBatchNorm
        (nn.BatchNorm2d(3)(x_all[mine]) - ref_out[mine]).abs().max().item() if sizes[rank] > 1 else 0.0],
        device=device)
    dist.all_reduce(diffs, op=dist.ReduceOp.MAX)  # the worst rank decides
    per_rank = [x_all[mine].mean(dim=(0, 2, 3))[0].item() if sizes[rank] else None]
    everyone = [None] * world
    dist.all_gather_object(everyone, per_rank[0])
    return diffs.tolist(), everyone, x_all.mean(dim=(0, 2, 3))[0].item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-sizes", default=None, help="per rank, comma-separated, e.g. 3,5")
    args = parser.parse_args()
    backend, device = ddp_common.backend_and_device()
    world = int(os.environ.get("WORLD_SIZE", 1))
    try:
        sizes = [int(s) for s in args.batch_sizes.split(",")] if args.batch_sizes else [4] * world
    except ValueError:
        sys.exit(f"--batch-sizes must be whole numbers separated by commas, got {args.batch_sizes!r}")
    if len(sizes) != world or min(sizes) < 0:
        sys.exit(f"--batch-sizes needs one size >= 0 per rank: {world} ranks, got {args.batch_sizes!r}")
    if sum(sizes) == 0:
        sys.exit("--batch-sizes are all 0: BatchNorm needs more than 1 value per channel when training")
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    rank = dist.get_rank()
    try:  # torch's own module, on this machine
        nn.SyncBatchNorm(3).to(device)(torch.randn(2, 3, 4, 4, device=device))
        refused = None
    except (ValueError, RuntimeError) as e:
        refused = str(e).splitlines()[0]
    (forward_diff, input_grad_diff, param_grad_diff, stats_diff, per_rank_diff), first_channel_means, global_mean = \
        check(sizes, rank, device)
    tolerance = 1e-5  # parameter gradients are sums over every sample: larger numbers, so 1e-4
    result = {"world_size": dist.get_world_size(), "batch_sizes": sizes, "torch_syncbn_on_this_device": refused,
              "forward_matches": forward_diff < tolerance, "input_grad_matches": input_grad_diff < tolerance,
              "param_grad_matches": param_grad_diff < 10 * tolerance, "running_stats_match": stats_diff < tolerance,
              "max_diff": {"forward": forward_diff, "input_grad": input_grad_diff, "param_grad": param_grad_diff,
                           "running_stats": stats_diff, "per_rank_bn_forward": per_rank_diff},
              "per_rank_bn_matches": per_rank_diff < tolerance,
              "channel0_mean_per_rank": first_channel_means, "channel0_mean_global": global_mean,
              "allreduces": {"forward": ALL_REDUCES["forward"], "backward": ALL_REDUCES["backward"]}}
    if device.type == "cuda":  # the real nn.SyncBatchNorm, through the same checks
        torch_diffs = check(sizes, rank, device, synced_bn=nn.SyncBatchNorm)[0][:4]
        result["torch_syncbn_max_diff"] = max(torch_diffs)
    if rank == 0:
        print("RESULT " + json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
