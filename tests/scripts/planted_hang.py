"""A planted hang: each rank stops somewhere else, so a stack dump can tell them apart.
rank 0 waits in all_reduce (nobody joins it), rank 1 sleeps, rank 2 waits in recv from rank 1."""
import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"rank {rank} about to hang", flush=True)
    if rank == 0:
        dist.all_reduce(torch.ones(1))
    elif rank == 1:
        time.sleep(600)
    else:
        dist.recv(torch.zeros(1), src=1)


main()
