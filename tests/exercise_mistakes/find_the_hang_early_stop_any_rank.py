"""A typical wrong answer to find_the_hang/early_stop.py: it no longer hangs (every rank stops as soon as ANY
rank's own validation loss stops improving), but that is not the decision the script asks for: the RESULT
differs from the reference's."""
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
        stop = torch.tensor([1.0 if val_loss >= best else 0.0])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # one rank's own decision, imposed on all
        if stop.item():
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
