"""The smallest real DDP training run: wrap, train a few steps, check the ranks agree.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/ddp_minimal.py --steps 5
"""
import argparse
import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_common import backend_and_device  # import before init_process_group


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    backend, device = backend_and_device()
    dist.init_process_group(backend)
    rank, world_size = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(rank)  # different start weights per rank: DDP broadcasts rank 0's
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    for step in range(args.steps):
        x = torch.randn(8, 16, generator=data).to(device)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces (averages) the gradients during backward
        optimizer.step()
    print(f"rank {rank}: trained {args.steps} steps, last local loss {loss.item():.4f}")

    # Same averaged gradients on every rank => same weights on every rank.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world_size)]
    dist.all_gather(gathered, flat)
    agree = all(torch.equal(gathered[0], g) for g in gathered)
    if rank == 0:
        print(f"weights identical on all {world_size} ranks: {agree}")
        print("RESULT " + json.dumps({"world_size": world_size, "steps": args.steps, "params_agree": agree}))

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
