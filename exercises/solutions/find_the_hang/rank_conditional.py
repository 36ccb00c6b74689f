"""A solution of find_the_hang/rank_conditional.py: every rank calls the collective; only rank 0 reports.
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
        if step % 3 == 2:  # every rank joins the all_reduce; only rank 0 prints (below)
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
