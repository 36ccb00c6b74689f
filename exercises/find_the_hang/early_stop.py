"""find_the_hang 2 of 3: an early stop that one rank decides alone.

    torchrun --standalone --nproc-per-node=3 exercises/find_the_hang/early_stop.py

Each rank computes a validation loss on its own shard; when it stops improving, training stops. It hangs:
one rank stops, the others wait for it in the next all-reduce. Fix it so that every rank stops at the same
step, decided from the validation loss averaged over all ranks, and the RESULT line matches the reference.
"""
import json

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    weight = torch.zeros(1)
    best, stopped_at = float("inf"), None
    for step in range(20):
        update = torch.full((1,), 0.1)
        dist.all_reduce(update)  # stands in for the training step's gradient average: every rank must be here
        weight += update / world
        # This rank's validation loss: the ranks' shards differ, so their curves bottom out at different steps.
        val_loss = (weight.item() - 0.6 - 0.2 * rank) ** 2
        if val_loss >= best:  # the bug: each rank decides alone, from its own shard
            stopped_at = step
            break
        best = val_loss
    if rank == 0:
        print(f"rank 0: stopped at step {stopped_at}, weight {weight.item():.2f}")
        print("RESULT " + json.dumps({"stopped_at": stopped_at, "weight": round(weight.item(), 4)}))
    dist.barrier()  # everyone done before anyone leaves
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
