"""Uneven inputs: one rank has one batch more than the others, and DDP waits for it forever.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/uneven_inputs.py [--join]

Rank r gets 3 + r batches; each backward() all-reduces, so the rank with the extra batch waits
for partners that have left the loop. --join runs Join twice: with throw_on_early_termination=True
(every rank raises once one runs out), then the default (a rank out of data answers with zeros).
"""
import argparse
import json

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_common import backend_and_device  # import before init_process_group

LR = 0.1
PYTHON_ALL_REDUCES = [0]  # Join's all-reduces go through dist.all_reduce; DDP's gradient all-reduce is C++
_all_reduce = dist.all_reduce


def counted_all_reduce(*args, **kwargs):
    PYTHON_ALL_REDUCES[0] += 1
    return _all_reduce(*args, **kwargs)


dist.all_reduce = counted_all_reduce  # Join calls it through the torch.distributed module


def batches_of(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(rank)
    return [(torch.randn(4, 3, generator=generator), torch.randn(4, 1, generator=generator))
            for _ in range(3 + rank)]


def reference(world_size: int) -> torch.Tensor:
    """The same schedule in one process: at each step, sum the gradients of the ranks that still have
    a batch and divide by the world size (a joined rank contributes zeros)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    data = [batches_of(r) for r in range(world_size)]
    for step in range(max(len(d) for d in data)):
        grads = [torch.autograd.grad(torch.nn.functional.mse_loss(model(d[step][0]), d[step][1]),
                                     list(model.parameters())) for d in data if step < len(d)]
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                p -= LR * sum(g[i] for g in grads) / world_size
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def fresh_ddp(device):
    torch.manual_seed(0)  # the same start on every rank, and for every run
    return DDP(torch.nn.Linear(3, 1).to(device))


def train(model, batches, device) -> int:
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x.to(device)), y.to(device)).backward()  # all-reduces: every rank
        optimizer.step()
    return len(batches)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--join", action="store_true", help="wrap the loop in torch's Join context manager")
    args = parser.parse_args()

    backend, device = backend_and_device()
    dist.init_process_group(backend)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    batches = batches_of(rank)
    model = fresh_ddp(device)  # before the line below: a launch's timeout_from="batches" counts from the loop
    print(f"rank {rank}: {len(batches)} batches")

    thrown, per_step = None, {}  # Join's own all-reduces per training step, on a rank that still has data
    if args.join:
        try:  # every rank raises once one has run out, and all stop at the same step
            with Join([model], throw_on_early_termination=True):
                before = PYTHON_ALL_REDUCES[0]
                steps = train(model, batches, device)
                per_step["throw_on_early_termination=True"] = (PYTHON_ALL_REDUCES[0] - before) / steps
        except RuntimeError as error:
            thrown = str(error)
        print(f"rank {rank}: throw_on_early_termination=True: RuntimeError: {thrown}")
        model = fresh_ddp(device)
        with Join([model]):  # a rank out of data shadows the others' all-reduces until all are done
            before = PYTHON_ALL_REDUCES[0]
            steps = train(model, batches, device)
            per_step["default"] = (PYTHON_ALL_REDUCES[0] - before) / steps
    else:
        train(model, batches, device)
    print(f"rank {rank}: finished its {len(batches)} batches")

    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
    everyone = [None] * world_size
    dist.all_gather_object(everyone, (weights, thrown))
    if rank == 0:
        print("RESULT " + json.dumps({
            "batches_per_rank": [3 + r for r in range(world_size)],
            "weights_equal_on_every_rank": all(torch.equal(w, weights) for w, _ in everyone),
            "matches_one_process": torch.allclose(weights, reference(world_size), atol=1e-6),
            "join_all_reduces_per_step": per_step,  # rank 0's
            "thrown_with_throw_on_early_termination": [t for _, t in everyone]}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
