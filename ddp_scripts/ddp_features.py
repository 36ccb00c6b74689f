"""What torch's DDP adds to the from-scratch versions, one demo each.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/ddp_features.py --demo broadcast unused bucket-view --find-unused
"""
import argparse
import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_common import backend_and_device  # import before init_process_group


class TwoHeads(torch.nn.Module):
    """forward uses head_a only: head_b's parameters get no gradient."""

    def __init__(self):
        super().__init__()
        self.body, self.head_a, self.head_b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1), torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.head_a(self.body(x))


def demo_broadcast(device):
    torch.manual_seed(dist.get_rank())  # different weights on each rank
    model = torch.nn.Linear(4, 1).to(device)
    before = round(model.weight[0, 0].item(), 4)
    model = DDP(model)  # construction broadcasts rank 0's parameters and buffers
    after = round(model.module.weight[0, 0].item(), 4)
    print(f"rank {dist.get_rank()}: weight[0,0] before DDP {before:+.4f}, after {after:+.4f}")
    return {"before": before, "after": after}


def demo_unused(device, find_unused):
    torch.manual_seed(0)
    model = DDP(TwoHeads().to(device), find_unused_parameters=find_unused)
    for step in range(3):
        # head_b gets no gradient: without find_unused_parameters its bucket never fills; the next forward() raises.
        model(torch.randn(4, 8, device=device)).sum().backward()
    print(f"rank {dist.get_rank()}: 3 steps, unused head, find_unused_parameters={find_unused}: ok")
    return {"steps": 3}


def demo_bucket_view(device):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    shares = {}
    for as_view in (False, True):
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(64, 64).to(device), gradient_as_bucket_view=as_view)
        buckets = []  # DDP's own flat buckets, as its comm hook receives them

        def keep_bucket(group, bucket):
            buckets.append(bucket.buffer())
            return allreduce_hook(group, bucket)  # the default all-reduce, unchanged

        model.register_comm_hook(dist.group.WORLD, keep_bucket)
        model(torch.randn(4, 64, device=device)).sum().backward()
        # Does .grad live in the memory of one of DDP's buckets (a view, no copy)?
        grad = model.module.weight.grad.untyped_storage().data_ptr()
        shares[as_view] = any(b.untyped_storage().data_ptr() == grad for b in buckets)
        print(f"rank {dist.get_rank()}, gradient_as_bucket_view={as_view}: .grad in a bucket: {shares[as_view]}")
    return {"grad_is_bucket_view": shares[True], "grad_is_copy_without_flag": not shares[False]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--demo", choices=["broadcast", "unused", "bucket-view"], nargs="+", required=True)
    parser.add_argument("--find-unused", action="store_true")
    args = parser.parse_args()

    backend, device = backend_and_device()
    dist.init_process_group(backend)
    demos = {"broadcast": demo_broadcast, "bucket-view": demo_bucket_view,
             "unused": lambda device: demo_unused(device, args.find_unused)}
    results = []
    for demo in args.demo:
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, demos[demo](device))
        results.append({"demo": demo, "world_size": dist.get_world_size(), "ranks": everyone})
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(results[0] if len(results) == 1 else {"demos": results}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
