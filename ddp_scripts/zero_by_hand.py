"""ZeRO from scratch: each rank keeps the optimizer state of 1/N of the parameters, checked against torch's.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/zero_by_hand.py

One step: backward on every rank; reduce-scatter the gradients (each rank receives the averaged gradient of
its own shard only); AdamW updates that shard; all-gather the updated shards into every rank's full copy.
The reference is DDP with torch's ZeroRedundancyOptimizer, from the same start on the same data.
"""
import argparse
import json

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_common  # import before init_process_group (see ddp_common.py)


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 50), nn.ReLU(), nn.Linear(50, 50), nn.ReLU(), nn.Linear(50, 5))


class ShardedAdamW:
    """Optimizer state for this rank's 1/N of one flat vector of all the parameters (ZeRO stage 1 and 2)."""

    def __init__(self, model, lr):
        self.params = list(model.parameters())
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        numel = sum(p.numel() for p in self.params)
        self.shard_size = -(-numel // self.world)  # rounded up: the flat vector is padded to N equal shards
        flat = self.flatten([p.detach() for p in self.params])
        self.shard = nn.Parameter(flat[self.rank * self.shard_size:(self.rank + 1) * self.shard_size].clone())
        self.optimizer = torch.optim.AdamW([self.shard], lr=lr)  # exp_avg, exp_avg_sq: shard-sized

    def flatten(self, tensors):
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return torch.cat([flat, flat.new_zeros(self.shard_size * self.world - flat.numel())])

    def step(self):
        grads = self.flatten([p.grad for p in self.params]) / self.world  # the mean, as DDP would give
        my_grad = torch.empty_like(self.shard)
        dist.reduce_scatter(my_grad, list(grads.chunk(self.world)))  # sum over ranks, of my shard only
        self.shard.grad = my_grad
        self.optimizer.step()
        pieces = [torch.empty_like(self.shard) for _ in range(self.world)]
        dist.all_gather(pieces, self.shard.detach())  # everyone's updated shard, into every rank's full copy
        flat, offset = torch.cat(pieces), 0
        for p in self.params:
            p.data.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def state_bytes(self):
        return sum(v.numel() * v.element_size() for v in self.optimizer.state[self.shard].values() if torch.is_tensor(v))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    backend, device = ddp_common.backend_and_device()
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(1)
    x_all, y_all = torch.randn(8 * world, 12, generator=g), torch.randn(8 * world, 5, generator=g)
    x, y = x_all[8 * rank: 8 * (rank + 1)].to(device), y_all[8 * rank: 8 * (rank + 1)].to(device)

    ours = make_model().to(device)
    optimizer = ShardedAdamW(ours, lr=1e-2)
    for _ in range(args.steps):
        for p in ours.parameters():
            p.grad = None
        nn.functional.mse_loss(ours(x), y).backward()
        optimizer.step()

    ddp = DDP(make_model().to(device), device_ids=[device.index] if device.type == "cuda" else None)
    reference = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2)
    for _ in range(args.steps):
        reference.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        reference.step()

    diff = max((a - b).abs().max().item() for a, b in zip(ours.parameters(), ddp.module.parameters()))
    full_state = 2 * sum(p.numel() * p.element_size() for p in ours.parameters())  # AdamW's two buffers, unsharded
    if rank == 0:
        print(f"{args.steps} steps: ours == DDP + ZeroRedundancyOptimizer: max |diff| {diff:.1e}; optimizer state on "
              f"rank 0: {optimizer.state_bytes():,} bytes of {full_state:,} unsharded")
        print("RESULT " + json.dumps({"world_size": world, "matches_zero_redundancy_optimizer": diff < 1e-6,
                                      "max_abs_diff": diff, "optimizer_state_bytes": optimizer.state_bytes(),
                                      "unsharded_state_bytes": full_state}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
