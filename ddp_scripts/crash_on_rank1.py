"""A bug on one rank: what a failed launch looks like, and where its root cause is.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/crash_on_rank1.py [--without-record]

@record writes the rank's traceback to the error file torchrun reads (appendix 99, section 3).
"""
import sys

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from ddp_common import backend_and_device  # import before init_process_group


def main():
    backend, device = backend_and_device()
    dist.init_process_group(backend)
    rank = dist.get_rank()
    print(f"rank {rank} started")
    dist.barrier()  # every rank has printed its first line before rank 1's bug
    if rank == 1:
        raise ValueError("rank 1 has a bug: this is the root cause")
    dist.all_reduce(torch.ones(1, device=device))  # rank 0 waits here for rank 1, which is gone
    dist.destroy_process_group()


if __name__ == "__main__":
    if "--without-record" not in sys.argv:
        main = record(main)  # usually written as the decorator @record above def main()
    main()
