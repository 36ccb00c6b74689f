"""find_the_hang 1 of 3: a collective that only one rank calls.

    torchrun --standalone --nproc-per-node=3 exercises/find_the_hang/rank_conditional.py

Each rank trains on its own batches; every few steps rank 0 logs the mean loss over all ranks. It hangs.
Fix it so that it finishes and prints the same RESULT line; change as little as you can.
"""
import json

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    logged = []
    for step in range(6):
        loss = torch.rand(()) + 1.0 / (step + 1)  # stands in for this rank's training loss
        if step % 3 == 2 and rank == 0:  # the bug is on this line
            mean = loss.clone()
            dist.all_reduce(mean)
            logged.append(round(mean.item() / world, 4))
    if rank == 0:
        print(f"rank 0: logged {logged}")
        print("RESULT " + json.dumps({"logged_mean_losses": logged}))
    dist.barrier()  # everyone done before anyone leaves
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
