"""Collectives that differ between ranks: a different shape, or a different order.

    TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --standalone --nproc-per-node=2 \
        ddp_scripts/mismatched_collectives.py --mismatch shape|order|none [...] [--collective-timeout SECONDS]

With DETAIL, a mismatch raises before the call runs: the next case can run.
"""
import argparse
import datetime
import sys

import torch
import torch.distributed as dist

from ddp_common import backend_and_device  # import before init_process_group


def run_case(mismatch, rank, device):
    if mismatch == "shape":  # e.g. a last batch that is smaller on one rank
        dist.all_reduce(torch.ones(4 + rank, device=device))
    elif mismatch == "order":  # e.g. a branch that logs a metric on one rank before the other collective
        first, second = ("all_reduce", "broadcast") if rank == 0 else ("broadcast", "all_reduce")
        for op in (first, second):
            tensor = torch.ones(4, device=device)
            dist.all_reduce(tensor) if op == "all_reduce" else dist.broadcast(tensor, src=0)
    else:
        dist.all_reduce(torch.ones(4, device=device))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mismatch", choices=["shape", "order", "none"], nargs="+", required=True)
    parser.add_argument("--collective-timeout", type=float, default=1800)
    args = parser.parse_args()

    backend, device = backend_and_device()
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.collective_timeout))
    rank = dist.get_rank()
    raised = False
    for mismatch in args.mismatch:
        try:
            run_case(mismatch, rank, device)
            print(f"rank {rank}: {mismatch}: done")
        except RuntimeError as error:
            if "Detected mismatch" not in str(error):
                raise  # not DETAIL's check (a timeout, say): stop
            raised = True
            print(f"rank {rank}: {mismatch}: RuntimeError: {error}")
    dist.destroy_process_group()
    sys.exit(1 if raised else 0)


if __name__ == "__main__":
    main()
