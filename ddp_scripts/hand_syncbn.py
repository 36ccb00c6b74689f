"""SyncBatchNorm built by hand: the autograd.Function, the module and the converter. CPU/gloo or GPU/nccl.

forward all-reduces (count, sum, sum of squares) per channel, once; backward all-reduces the two sums
BatchNorm's gradient needs (sum of dy, sum of dy * x_hat), once. Per-rank batch sizes may differ, even be 0.
"""
import time

import torch
import torch.distributed as dist
from torch import nn

ALL_REDUCES = {"forward": 0, "backward": 0, "seconds": 0.0}  # what synchronizing costs, counted and timed


def timed_all_reduce(tensor, phase):
    if tensor.is_cuda:  # NCCL returns before the GPU is done: wait for it, or the clock reads launch times
        torch.cuda.synchronize(tensor.device)
    start = time.perf_counter()
    dist.all_reduce(tensor)
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)
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

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        if not (affine and track_running_stats):  # the Function needs a weight, a bias and running statistics
            raise ValueError(f"HandSyncBatchNorm2d needs affine=True and track_running_stats=True, "
                             f"got affine={affine}, track_running_stats={track_running_stats}")
        super().__init__(num_features, eps, momentum)

    def forward(self, x):
        if not self.training:
            return super().forward(x)
        self.num_batches_tracked.add_(1)  # as BatchNorm counts; momentum=None reads it
        # momentum=None: the running statistics are the plain average of every batch so far, as in BatchNorm
        momentum = 1.0 / self.num_batches_tracked.item() if self.momentum is None else self.momentum
        return SyncBatchNormFunction.apply(x, self.weight, self.bias, self.running_mean, self.running_var,
                                           self.eps, momentum)


def convert_to_hand_sync(module):
    """Swap every BatchNorm2d for HandSyncBatchNorm2d, like nn.SyncBatchNorm.convert_sync_batchnorm, with one
    difference: the new layers hold *new* Parameters (copies), so build the optimizer (and DDP) after this."""
    if isinstance(module, nn.BatchNorm2d):
        synced = HandSyncBatchNorm2d(module.num_features, module.eps, module.momentum, module.affine,
                                     module.track_running_stats).to(module.running_mean.device)
        synced.load_state_dict(module.state_dict())
        return synced.train(module.training)
    for name, child in module.named_children():
        module.add_module(name, convert_to_hand_sync(child))
    return module
