"""DDP from scratch, in three steps, each checked against one big batch and torch's DDP.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/ddp_from_scratch.py --variant bucketed

naive:    after backward(), all-reduce every gradient and divide by the world size.
overlap:  a hook per parameter starts an async all-reduce as soon as its gradient is
          ready, so communication overlaps the rest of backward; wait before step().
bucketed: gradients are copied into flat buckets of --bucket-mb; a bucket is
          all-reduced as soon as it is full: fewer, larger messages (see lesson 02).
"""
import argparse
import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ddp_common import backend_and_device  # import before init_process_group


def broadcast_parameters(model):
    """What DDP does at construction: every rank starts from rank 0's weights."""
    for tensor in list(model.parameters()) + list(model.buffers()):
        dist.broadcast(tensor.data, src=0)


class NaiveDDP:
    def __init__(self, model):
        self.model = model
        broadcast_parameters(model)

    def finish_gradients(self):  # call after backward(), before optimizer.step()
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


class OverlapDDP:
    def __init__(self, model):
        self.model = model
        broadcast_parameters(model)
        self.pending = []
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(self.start_all_reduce)

    def start_all_reduce(self, p):  # runs during backward, once p.grad is final
        self.pending.append((p, dist.all_reduce(p.grad, async_op=True)))

    def finish_gradients(self):
        for p, work in self.pending:
            work.wait()
            p.grad /= dist.get_world_size()
        self.pending.clear()


class BucketedDDP:
    def __init__(self, model, bucket_mb):
        self.model = model
        broadcast_parameters(model)
        cap = bucket_mb * 2**20
        # Gradients arrive roughly in reverse order of definition: bucket them that way.
        self.buckets, current, size = [], [], 0
        for p in reversed(list(model.parameters())):
            if current and size + p.numel() * p.element_size() > cap:
                self.buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += p.numel() * p.element_size()
        self.buckets.append(current)
        self.flat = [torch.zeros(sum(p.numel() for p in b), dtype=b[0].dtype, device=b[0].device)
                     for b in self.buckets]
        self.where = {}  # parameter -> (bucket index, offset in its flat buffer)
        for i, bucket in enumerate(self.buckets):
            offset = 0
            for p in bucket:
                self.where[p] = (i, offset)
                offset += p.numel()
                p.register_post_accumulate_grad_hook(self.gradient_ready)
        self.ready = [0] * len(self.buckets)
        self.pending = {}

    def gradient_ready(self, p):
        i, offset = self.where[p]
        self.flat[i][offset: offset + p.numel()].copy_(p.grad.view(-1))
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets[i]):  # bucket full: send it now
            self.pending[i] = dist.all_reduce(self.flat[i], async_op=True)

    def finish_gradients(self):
        for i, work in self.pending.items():
            work.wait()
            self.flat[i] /= dist.get_world_size()
            for p in self.buckets[i]:
                _, offset = self.where[p]
                p.grad.copy_(self.flat[i][offset: offset + p.numel()].view_as(p.grad))
        self.pending.clear()
        self.ready = [0] * len(self.buckets)


def make_model(seed, device):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                               torch.nn.Tanh(), torch.nn.Linear(64, 4)).to(device)


def train(model, batches, steps, before_step=lambda: None):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        x, y = batches[step]
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        before_step()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", choices=["naive", "overlap", "bucketed"], required=True)
    parser.add_argument("--bucket-mb", type=float, default=0.01)  # tiny model: several buckets
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-per-rank", type=int, default=8)
    args = parser.parse_args()

    backend, device = backend_and_device()
    dist.init_process_group(backend)
    rank, world_size = dist.get_rank(), dist.get_world_size()

    # The same global batches on every rank; rank r trains on its slice of each.
    g = torch.Generator().manual_seed(0)
    global_batches = [(torch.randn(args.batch_per_rank * world_size, 32, generator=g),
                       torch.randn(args.batch_per_rank * world_size, 4, generator=g)) for _ in range(args.steps)]
    global_batches = [(x.to(device), y.to(device)) for x, y in global_batches]
    mine = [(x.chunk(world_size)[rank], y.chunk(world_size)[rank]) for x, y in global_batches]

    # Ours. Each rank starts from different weights: the broadcast must fix that.
    model = make_model(seed=rank, device=device)
    if args.variant == "naive":
        ddp = NaiveDDP(model)
    elif args.variant == "overlap":
        ddp = OverlapDDP(model)
    else:
        ddp = BucketedDDP(model, args.bucket_mb)
    ours = train(model, mine, args.steps, before_step=ddp.finish_gradients)

    # One process, the whole batch: the mean loss over N*B samples = average of the ranks' means.
    single = train(make_model(seed=0, device=device), global_batches, args.steps)
    # torch's DDP, from the same different starting weights.
    theirs = train(DistributedDataParallel(make_model(seed=rank, device=device)), mine, args.steps)

    diffs = torch.stack([(ours - single).abs().max(), (ours - theirs).abs().max()])
    dist.all_reduce(diffs, op=dist.ReduceOp.MAX)  # the worst rank decides
    diff_single, diff_torch = diffs.tolist()
    if rank == 0:
        print(f"{args.variant}, {world_size} ranks, {args.steps} steps: max |ours - single process| = "
              f"{diff_single:.0e}, max |ours - torch DDP| = {diff_torch:.0e}")
        result = {"variant": args.variant, "world_size": world_size,
                  "matches_single_process": diff_single < 1e-5, "matches_torch_ddp": diff_torch < 1e-5,
                  "max_abs_diff": max(diff_single, diff_torch)}
        if args.variant == "bucketed":
            result["buckets"] = len(ddp.buckets)
        print("RESULT " + json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
