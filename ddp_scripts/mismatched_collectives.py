"""Collectives that differ between ranks: a different shape, or a different order.

    TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --standalone --nproc-per-node=2 \
        ddp_scripts/mismatched_collectives.py --mismatch shape|order [--collective-timeout SECONDS]
"""
import argparse
import datetime

import torch
import torch.distributed as dist

from ddp_common import backend_and_device  # import before init_process_group


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mismatch", choices=["shape", "order", "none"], required=True)
    parser.add_argument("--collective-timeout", type=float, default=1800)
    args = parser.parse_args()

    backend, device = backend_and_device()
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.collective_timeout))
    rank = dist.get_rank()
    if args.mismatch == "shape":  # e.g. a last batch that is smaller on one rank
        dist.all_reduce(torch.ones(4 + rank, device=device))
    elif args.mismatch == "order":  # e.g. a branch that logs a metric on one rank before the other collective
        first, second = ("all_reduce", "broadcast") if rank == 0 else ("broadcast", "all_reduce")
        for op in (first, second):
            tensor = torch.ones(4, device=device)
            dist.all_reduce(tensor) if op == "all_reduce" else dist.broadcast(tensor, src=0)
    else:
        dist.all_reduce(torch.ones(4, device=device))
    print(f"rank {rank}: done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
