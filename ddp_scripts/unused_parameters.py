"""Unused parameters: what find_unused_parameters=True costs, and static_graph=True.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/unused_parameters.py [--steps 30]

Each configuration trains the same deep model for --steps steps; the ranks must agree on the weights.
"""
import argparse
import json
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_common import backend_and_device  # import before init_process_group

CONFIGS = {  # name: (the model has an unused head, DDP's keyword arguments)
    "every parameter used, no flag": (False, {}),
    "every parameter used, find_unused_parameters=True": (False, {"find_unused_parameters": True}),
    "unused head, find_unused_parameters=True": (True, {"find_unused_parameters": True}),
    "unused head, static_graph=True": (True, {"static_graph": True}),
}


class DeepWithSpareHead(torch.nn.Module):
    def __init__(self, spare_head):
        super().__init__()
        self.body = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU())
                                          for _ in range(16)])  # a deep graph: a long walk for DDP
        self.head = torch.nn.Linear(32, 1)
        self.spare_head = torch.nn.Linear(32, 1) if spare_head else None  # never called in forward

    def forward(self, x):
        return self.head(self.body(x))


def train(spare_head, ddp_kwargs, steps, device) -> tuple[float, bool]:
    torch.manual_seed(0)
    model = DDP(DeepWithSpareHead(spare_head).to(device), **ddp_kwargs)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(dist.get_rank())
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(16, 32, generator=generator).to(device)).pow(2).mean().backward()
        optimizer.step()
    seconds_per_step = (time.perf_counter() - start) / steps
    weights = torch.cat([p.detach().flatten() for p in model.module.head.parameters()]).cpu()
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, weights)
    return seconds_per_step, all(torch.equal(w, weights) for w in everyone)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    backend, device = backend_and_device()
    dist.init_process_group(backend)
    rank = dist.get_rank()
    rows = []
    for name, (spare_head, ddp_kwargs) in CONFIGS.items():
        seconds, agree = train(spare_head, ddp_kwargs, args.steps, device)
        rows.append({"config": name, "ms_per_step": round(seconds * 1e3, 3), "ranks_agree": agree})
        print(f"rank {rank}: {name:<50} trained {args.steps} steps, ranks agree: {agree}")
    if rank == 0:
        print("RESULT " + json.dumps({"steps": args.steps, "rows": rows}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
