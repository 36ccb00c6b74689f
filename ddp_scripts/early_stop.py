"""Early stopping under DDP: rank 0 deciding alone hangs the others; an agreed decision stops every rank together.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/early_stop.py --decide all
    torchrun --standalone --nproc-per-node=2 ddp_scripts/early_stop.py --decide rank0    # hangs: stop it
"""
import argparse
import importlib.util
import json
import logging
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_common import backend_and_device  # import before init_process_group

log = logging.getLogger("train")


def setup_logging(rank):
    # The rank in every record; rank 0 at INFO, the others at WARNING: a warning from any rank still shows.
    logging.basicConfig(format=f"%(levelname)s rank {rank} %(name)s: %(message)s",
                        level=logging.INFO if rank == 0 else logging.WARNING)


def digits():
    """1792 8x8 digits, from the file scikit-learn ships."""
    sklearn_dir = importlib.util.find_spec("sklearn").submodule_search_locations[0]
    table = np.loadtxt(os.path.join(sklearn_dir, "datasets", "data", "digits.csv.gz"), delimiter=",")[:1792]
    return torch.tensor(table[:, :-1], dtype=torch.float32) / 16, torch.tensor(table[:, -1]).long()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--decide", choices=["rank0", "all"], nargs="+", required=True)
    parser.add_argument("--patience", type=int, default=3, help="evaluations without improvement before stopping")
    parser.add_argument("--eval-every", type=int, default=5, help="steps between evaluations")
    parser.add_argument("--max-steps", type=int, default=500)
    args = parser.parse_args()

    backend, device = backend_and_device()
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    setup_logging(dist.get_rank())
    for decide in args.decide:
        train(decide, args, device)
    dist.destroy_process_group()


def train(decide, args, device):
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = digits()
    x_train, y_train, x_val, y_val = x[:1536], y[:1536], x[1536:].to(device), y[1536:].to(device)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)).to(device),
                device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    per_rank = 32
    best, evals_without_improvement = float("inf"), 0
    log.warning("started training (--decide %s)", decide)  # a warning: every rank logs it
    for step in range(1, args.max_steps + 1):
        batch = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(step))[:per_rank * world]
        mine = batch[rank * per_rank:(rank + 1) * per_rank]  # this rank's share of the step's global batch
        loss = F.cross_entropy(model(x_train[mine].to(device)), y_train[mine].to(device))
        optimizer.zero_grad()
        loss.backward()  # DDP's all-reduce: every rank must get here, every step
        optimizer.step()

        wants_to_stop = False
        if rank == 0 and step % args.eval_every == 0:
            with torch.no_grad():  # model.module: the plain model, no collective inside
                val_loss = F.cross_entropy(model.module(x_val), y_val).item()
            if val_loss < best - 1e-3:
                best, evals_without_improvement = val_loss, 0
            else:
                evals_without_improvement += 1
            wants_to_stop = evals_without_improvement >= args.patience
            log.info("step %d: validation loss %.4f, %d evaluation(s) without improvement",
                     step, val_loss, evals_without_improvement)
        if decide == "rank0":
            if wants_to_stop:  # the bug: only rank 0 knows, only rank 0 leaves
                log.info("stopping at step %d (rank 0 alone)", step)
                break
        else:
            stop = torch.tensor([float(wants_to_stop)], device=device)
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # one collective per step, on every rank: all agree
            if stop.item():
                log.info("stopping at step %d (agreed by all ranks)", step)
                break

    stopped = [None] * world
    dist.all_gather_object(stopped, step)  # where each rank left the loop
    if rank == 0:
        log.info("every rank stopped at step %s", stopped)
        print("RESULT " + json.dumps({"decide": decide, "stopped_at_step": stopped,
                                      "stopped_together": len(set(stopped)) == 1, "best_val_loss": best}), flush=True)


if __name__ == "__main__":
    main()
