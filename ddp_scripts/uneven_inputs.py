"""Uneven inputs: one rank has one batch more than the others, and DDP waits for it forever.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/uneven_inputs.py [--join] [--collective-timeout S]

Rank r gets 3 + r batches. Each backward() all-reduces the gradients, so every rank must run
the same number of them. The rank with the extra batch waits in its last backward for partners
that have left the loop. torch's Join context manager fixes it: a rank that runs out of data
keeps answering the others' all-reduces with zeros until every rank is done.
The RESULT checks the outcome two ways: the weights are equal on every rank, and they equal
what the same schedule gives in one process (the mean over the ranks that still had a batch,
divided by the world size, as DDP's default divide_by_initial_world_size=True does).
"""
import argparse
import datetime
import json

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_common import backend_and_device  # import before init_process_group

LR = 0.1


def batches_of(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(rank)
    return [(torch.randn(4, 3, generator=generator), torch.randn(4, 1, generator=generator))
            for _ in range(3 + rank)]


def loss_of(model, batch) -> torch.Tensor:
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


def reference(world_size: int) -> torch.Tensor:
    """The same schedule in one process: at each step, sum the gradients of the ranks that still have
    a batch and divide by the world size (a joined rank contributes zeros)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    data = [batches_of(r) for r in range(world_size)]
    for step in range(max(len(d) for d in data)):
        grads = [torch.autograd.grad(loss_of(model, d[step]), list(model.parameters()))
                 for d in data if step < len(d)]
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                p -= LR * sum(g[i] for g in grads) / world_size
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--join", action="store_true", help="wrap the loop in torch's Join context manager")
    parser.add_argument("--collective-timeout", type=float, default=1800)
    args = parser.parse_args()

    backend, device = backend_and_device()
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.collective_timeout))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(3, 1).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    batches = batches_of(rank)
    print(f"rank {rank}: {len(batches)} batches")

    def train():
        for x, y in batches:
            optimizer.zero_grad()
            loss_of(model, (x.to(device), y.to(device))).backward()  # all-reduces: every rank must be here
            optimizer.step()

    if args.join:
        with Join([model]):  # a rank out of data shadows the others' all-reduces until all are done
            train()
    else:
        train()
    print(f"rank {rank}: finished its {len(batches)} batches")

    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
    everyone = [None] * world_size
    dist.all_gather_object(everyone, weights)
    if rank == 0:
        print("RESULT " + json.dumps({
            "batches_per_rank": [3 + r for r in range(world_size)],
            "weights_equal_on_every_rank": all(torch.equal(w, weights) for w in everyone),
            "matches_one_process": torch.allclose(weights, reference(world_size), atol=1e-6)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
