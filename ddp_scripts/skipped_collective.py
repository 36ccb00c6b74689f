"""A rank that skips a collective: rank 0 evaluates through the DDP model, rank 1 goes on to the barrier.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/skipped_collective.py [--fix]
        [--barrier plain|monitored] [--collective-timeout SECONDS] [--flight-recorder]

In train mode, DDP's forward() broadcasts rank 0's buffers (BatchNorm's running statistics)
to every rank: a collective. Called on rank 0 alone, it waits for a partner that never
comes (or pairs with the wrong call on the other rank). --fix evaluates model.module, the
plain module inside, which runs no collective.
"""
import argparse
import datetime
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_common import backend_and_device  # import before init_process_group


def evaluate(model, device) -> float:
    model.eval()  # BatchNorm uses its running statistics; DDP still syncs buffers (require_forward_param_sync)
    with torch.no_grad():
        score = model(torch.ones(4, 8, device=device)).mean().item()
    model.train()
    return score


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fix", action="store_true", help="evaluate model.module, not the DDP wrapper")
    parser.add_argument("--barrier", choices=["plain", "monitored"], default="plain")
    parser.add_argument("--collective-timeout", type=float, default=1800,
                        help="init_process_group(timeout=): how long a collective may wait (gloo's default: 30 min)")
    parser.add_argument("--flight-recorder", action="store_true",
                        help="on failure, print the last collectives this rank issued (needs TORCH_FR_BUFFER_SIZE)")
    args = parser.parse_args()

    backend, device = backend_and_device()
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.collective_timeout))
    rank = dist.get_rank()
    # monitored_barrier needs gloo; in a group of its own, 2 s longer, rank 0's stuck collective times out first
    barrier_timeout = datetime.timedelta(seconds=args.collective_timeout + 2)
    barrier_group = dist.new_group(backend="gloo", timeout=barrier_timeout) if args.barrier == "monitored" else None
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8)).to(device))
    model(torch.randn(4, 8, device=device)).sum().backward()  # one training step's forward and backward
    print(f"rank {rank}: trained one step", flush=True)

    try:
        if rank == 0:  # the bug: evaluation on rank 0 only, through the DDP wrapper
            score = evaluate(model.module if args.fix else model, device)
            print(f"rank 0: evaluated, score {score:.4f}")
        print(f"rank {rank}: at the barrier", flush=True)
        if args.barrier == "monitored":  # rank 0 hears from each rank in turn, and names a missing one
            dist.monitored_barrier(group=barrier_group, timeout=barrier_timeout)
        else:
            dist.barrier()
    except Exception as error:
        print(f"rank {rank}: {type(error).__name__}: {str(error).splitlines()[0]}")
        if args.flight_recorder:
            print_flight_recorder(rank, backend)
        wait_until_every_rank_has_reported(rank, dist.get_world_size())
        raise
    print(f"rank {rank}: passed the barrier")
    if rank == 0:
        print("RESULT " + json.dumps({"passed_barrier": True, "fix": args.fix}))
    dist.destroy_process_group()


def wait_until_every_rank_has_reported(rank, world_size, seconds=30):
    # torchrun stops the other ranks as soon as one fails (section 5): so each rank marks itself on torchrun's
    # store and raises once every rank has (or after `seconds`); none is cut off before it speaks.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=seconds))
    store.set(f"reported/{rank}", "yes")
    try:
        store.wait([f"reported/{other}" for other in range(world_size)])
    except dist.DistStoreError:
        print(f"rank {rank}: not every rank reported within {seconds} s")


def print_flight_recorder(rank, backend):
    # Two recorders: ProcessGroupNCCL records into the CUDA one, gloo (and other CPU backends) into the CPU one.
    from torch._C._distributed_c10d import _dump_fr_trace_json, _dump_nccl_trace_json
    dump = _dump_nccl_trace_json if backend == "nccl" else _dump_fr_trace_json
    entries = json.loads(dump(includeCollectives=True))["entries"]
    for entry in entries:
        print(f"rank {rank}: flight recorder: #{entry['collective_seq_id']} {entry['profiling_name']} "
              f"sizes {entry['input_sizes']}")


if __name__ == "__main__":
    main()
