"""Hello, distributed: who am I, what do I run on, and one all_reduce checked.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/hello_dist.py
"""
import json
import os

import torch
import torch.distributed as dist

from ddp_common import backend_and_device  # import before init_process_group


def main():
    # torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT for us.
    backend, device = backend_and_device()
    dist.init_process_group(backend)  # "env://": read the variables above
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    print(f"rank {rank} of {world_size} | local rank {local_rank} | backend {backend} | device {device}")

    # Every rank contributes rank + 1; after all_reduce(SUM) every rank holds 1 + 2 + ... + N.
    value = torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    expected = world_size * (world_size + 1) / 2
    print(f"all_reduce(SUM) of rank+1 = {value.item():g} (expected {expected:g}): {value.item() == expected}")

    if rank == 0:
        print("RESULT " + json.dumps({"world_size": world_size, "backend": backend,
                                      "all_reduce_sum": value.item(), "correct": value.item() == expected}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
