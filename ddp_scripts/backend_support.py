"""Which collectives run on CPU tensors with gloo? Every rank tries each one and checks its answer; rank 0 reports.

torchrun --standalone --nproc-per-node=2 backend_support.py
"""
import json

import torch
import torch.distributed as dist

import ddp_common  # noqa: F401  (before init_process_group: the clean exit of lesson 00)


def collectives(rank, world):
    """name -> a function that runs the collective and returns True when every rank got the right answer."""
    mine = lambda: torch.full((2,), float(rank + 1))  # rank r holds r+1
    total = world * (world + 1) / 2

    def send_recv():
        t = mine()
        if rank == 0:
            dist.send(t, dst=1)
        elif rank == 1:
            dist.recv(t, src=0)
        return rank != 1 or t[0].item() == 1

    def broadcast():
        t = mine(); dist.broadcast(t, src=0); return t[0].item() == 1

    def all_reduce():
        t = mine(); dist.all_reduce(t); return t[0].item() == total

    def reduce():
        t = mine(); dist.reduce(t, dst=0); return rank != 0 or t[0].item() == total

    def all_gather():
        out = [torch.empty(2) for _ in range(world)]; dist.all_gather(out, mine())
        return [o[0].item() for o in out] == [r + 1 for r in range(world)]

    def gather():
        out = [torch.empty(2) for _ in range(world)] if rank == 0 else None
        dist.gather(mine(), gather_list=out, dst=0)
        return rank != 0 or [o[0].item() for o in out] == [r + 1 for r in range(world)]

    def scatter():
        t = torch.empty(2)
        dist.scatter(t, scatter_list=[torch.full((2,), float(r)) for r in range(world)] if rank == 0 else None, src=0)
        return t[0].item() == rank

    def reduce_scatter():
        t = torch.empty(2); dist.reduce_scatter(t, [mine() for _ in range(world)]); return t[0].item() == total

    def all_to_all():
        out = [torch.empty(2) for _ in range(world)]
        dist.all_to_all(out, [mine() * 10 + r for r in range(world)])  # piece r goes to rank r
        return [o[0].item() for o in out] == [(r + 1) * 10 + rank for r in range(world)]

    def barrier():
        dist.barrier(); return True

    return {f.__name__.replace("send_recv", "send/recv"): f for f in
            (send_recv, broadcast, all_reduce, reduce, all_gather, gather, scatter, reduce_scatter, all_to_all, barrier)}


def main():
    # group_name is documented as deprecated and ignored: the default group keeps its own name.
    dist.init_process_group("gloo", group_name="my_experiment")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for name, run in collectives(rank, world).items():
        try:
            results[name] = bool(run())
        except RuntimeError as error:  # unsupported: a clear error on every rank, so no rank is left waiting
            results[name] = str(error).splitlines()[0]
    everyone = [None] * world
    dist.all_gather_object(everyone, results)
    if rank == 0:
        right_everywhere = {name: all(r[name] is True for r in everyone) for name in results}
        print("RESULT " + json.dumps({"world_size": world, "gloo_cpu": right_everywhere,
                                      "default_group_name": dist.group.WORLD.group_name}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
