"""A metric helper that circulates in DDP posts, next to the fix (lesson 05).

    torchrun --standalone --nproc-per-node=3 ddp_scripts/get_reduced.py

10 test samples on 3 ranks, each counted once (4, 3 and 3 samples), and a model right on samples 0-6: the
accuracy is 0.7. The helper reduces each rank's accuracy to one rank and divides by the world size, on every rank.
"""
import json

import torch
import torch.distributed as dist

from ddp_common import backend_and_device  # import before init_process_group


def get_reduced(tensor, current_device, dest_device, world_size):  # the helper as posted
    tensor = tensor.clone().detach() if torch.is_tensor(tensor) else torch.tensor(tensor)
    tensor = tensor.to(current_device)
    torch.distributed.reduce(tensor, dst=dest_device)
    tensor = tensor.item() / world_size
    return tensor


def main():
    backend, device = backend_and_device()
    dist.init_process_group(backend)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mine = list(range(rank, 10, world_size))  # this rank's test samples, none padded
    correct = sum(i < 7 for i in mine)  # the model is right on samples 0..6
    posted = get_reduced(correct / len(mine), device, 0, world_size)  # dst: a device index passed as a rank
    totals = torch.tensor([correct, len(mine)], dtype=torch.float64, device=device)
    dist.all_reduce(totals)  # the fix: sum the counts on every rank, then divide
    fixed = (totals[0] / totals[1]).item()
    everyone = [None] * world_size
    dist.all_gather_object(everyone, {"samples": len(mine), "own": correct / len(mine), "posted": posted,
                                      "fixed": fixed})
    if rank == 0:
        print("RESULT " + json.dumps({"ranks": everyone}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
