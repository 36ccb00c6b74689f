"""ZeRO-1 from scratch: each rank keeps the optimizer state of 1/N of the parameters, checked against torch's.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/zero_by_hand.py

One step: backward; reduce-scatter the gradients (each rank receives its own shard's average); AdamW updates
that shard; all-gather the shards into every rank's full copy. The references, from the same start on the
same data: DDP with torch's ZeroRedundancyOptimizer, and plain DDP with AdamW.
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
    """Optimizer state for this rank's 1/N of one flat vector of the trainable parameters (ZeRO stage 1).
    AdamW, or another optimizer class, with its arguments: ShardedAdamW(model, torch.optim.SGD, lr=0.1)."""

    def __init__(self, model, optimizer_class=torch.optim.AdamW, **optimizer_kwargs):
        self.params = [p for p in model.parameters() if p.requires_grad]  # frozen: never updated
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        numel = sum(p.numel() for p in self.params)
        self.shard_size = -(-numel // self.world)  # rounded up: the flat vector is padded to N equal shards
        flat = self.flatten([p.detach() for p in self.params])
        self.shard = nn.Parameter(flat[self.rank * self.shard_size:(self.rank + 1) * self.shard_size].clone())
        self.optimizer = optimizer_class([self.shard], **optimizer_kwargs)  # its state: shard-sized

    def flatten(self, tensors):
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return torch.cat([flat, flat.new_zeros(self.shard_size * self.world - flat.numel())])

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    def step(self):
        if any(p.grad is None for p in self.params):  # torch skips one; a flat shard cannot
            raise ValueError("a trainable parameter got no gradient in this step: ShardedAdamW updates them all")
        grads = self.flatten([p.grad for p in self.params]) / self.world  # the mean, as DDP would give
        # Not sharded: every full p.grad is still alive, and `grads` is a full-size copy next to them.
        self.grad_bytes_at_reduce_scatter = sum(p.grad.numel() * p.grad.element_size() for p in self.params) \
            + grads.numel() * grads.element_size()
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

    plain = DDP(make_model().to(device), device_ids=[device.index] if device.type == "cuda" else None)
    plain_adamw = torch.optim.AdamW(plain.parameters(), lr=1e-2)  # plain DDP: every rank keeps all the state
    for _ in range(args.steps):
        plain_adamw.zero_grad()
        nn.functional.mse_loss(plain(x), y).backward()
        plain_adamw.step()

    def state_bytes(optimizer):
        return sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))

    diff = max((a - b).abs().max().item() for a, b in zip(ours.parameters(), ddp.module.parameters()))
    diff_ddp = max((a - b).abs().max().item() for a, b in zip(ours.parameters(), plain.module.parameters()))
    held = {"ours": optimizer.state_bytes(), "zero_redundancy_optimizer": state_bytes(reference.optim),
            "ddp_adamw": state_bytes(plain_adamw)}  # ZeroRedundancyOptimizer's local optimizer: its shard only
    one_copy = sum(p.numel() * p.element_size() for p in ours.parameters())  # the gradients, once, unsharded
    if rank == 0:
        print(f"{args.steps} steps: ours == DDP + ZeroRedundancyOptimizer: max |diff| {diff:.1e}; == plain DDP + AdamW: "
              f"max |diff| {diff_ddp:.1e}")
        print(f"optimizer state on rank 0: ours {held['ours']:,} bytes, ZeroRedundancyOptimizer "
              f"{held['zero_redundancy_optimizer']:,}, plain DDP {held['ddp_adamw']:,}")
        print("RESULT " + json.dumps({"world_size": world, "matches_zero_redundancy_optimizer": diff < 1e-6,
                                      "matches_ddp": diff_ddp < 1e-6, "max_abs_diff": max(diff, diff_ddp),
                                      "optimizer_state_bytes": held, "gradient_bytes_one_copy": one_copy,
                                      "gradient_bytes_at_reduce_scatter": optimizer.grad_bytes_at_reduce_scatter}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
