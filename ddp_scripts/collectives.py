"""The collectives, one after another: every rank prints its tensor before and after each.

    torchrun --standalone --nproc-per-node=4 ddp_scripts/collectives.py --op all_reduce
    torchrun --standalone --nproc-per-node=3 ddp_scripts/collectives.py --op send_recv broadcast reduce

Before each collective, rank r starts again from [r+1, r+1] (rank 0 holds [1, 1], rank 1
[2, 2], ...), so you can read off the result which ranks' data went where.
"""
import argparse
import json

import torch
import torch.distributed as dist

from ddp_common import backend_and_device  # import before init_process_group

OPS = ["send_recv", "broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter", "barrier"]


def run_collective(op: str, mine: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    if op == "send_recv":  # point to point: rank 0 sends, rank 1 receives; the others watch
        if rank == 0:
            dist.send(mine, dst=1)
        elif rank == 1:
            dist.recv(mine, src=0)
        return mine
    if op == "broadcast":  # rank 0's tensor, copied to everyone
        dist.broadcast(mine, src=0)
        return mine
    if op == "reduce":  # the sum lands on rank 0 only; the others' buffers are scratch
        dist.reduce(mine, dst=0, op=dist.ReduceOp.SUM)
        return mine
    if op == "all_reduce":  # the sum, on every rank: what DDP does to gradients
        dist.all_reduce(mine, op=dist.ReduceOp.SUM)
        return mine
    if op == "all_gather":  # everyone gets everyone's tensor, concatenated in rank order
        gathered = [torch.empty_like(mine) for _ in range(n)]
        dist.all_gather(gathered, mine)
        return torch.cat(gathered)
    if op == "reduce_scatter":  # sum, then rank i keeps only piece i (half of all_reduce)
        pieces = [mine * (i + 1) for i in range(n)]  # piece i is [(r+1)(i+1), (r+1)(i+1)]
        out = torch.empty_like(mine)
        dist.reduce_scatter(out, pieces, op=dist.ReduceOp.SUM)
        return out
    if op == "barrier":  # no data: nobody leaves until everybody has arrived
        dist.barrier()
        return mine
    raise ValueError(op)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--op", choices=OPS, nargs="+", required=True, help="one or more, run in this order")
    args = parser.parse_args()

    backend, device = backend_and_device()
    dist.init_process_group(backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    if "send_recv" in args.op and n < 2:
        raise SystemExit("send_recv needs at least 2 ranks")

    results = []
    for op in args.op:
        mine = torch.full((2,), float(rank + 1), device=device)  # a fresh start for each collective
        before = mine.tolist()
        after = run_collective(op, mine).tolist()
        print(f"{op:>14}: rank {rank}: before {before}  after {after}")
        everyone = [None] * n
        dist.all_gather_object(everyone, {"before": before, "after": after})
        results.append({"op": op, "world_size": n,
                        "before": [e["before"] for e in everyone], "after": [e["after"] for e in everyone]})
    if rank == 0:
        print("RESULT " + json.dumps({"world_size": n, "collectives": results}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
