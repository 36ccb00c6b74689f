"""One small DDP training function, and four ways to start it (lesson 10).

    torchrun --standalone --nproc-per-node=2 ddp_scripts/tiny_train.py       # this file's entry
    python -m torch.distributed.launch --nproc-per-node=2 ddp_scripts/launch_legacy.py
    python ddp_scripts/launch_spawn.py --start-method spawn                 # or fork

train() takes its rank and world size as arguments, so every launcher can call it: torchrun's entry
reads them from the environment, mp.spawn passes the rank as the first argument.
"""
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_common import backend_and_device  # import before init_process_group: a clean exit

# What a launcher may set in the environment; train() reports which ones it found.
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")


def train(rank: int, world_size: int, launcher: str, local_rank: int | None = None, steps: int = 5):
    found = [name for name in LAUNCH_VARIABLES if name in os.environ]
    # backend_and_device() takes nccl + cuda:LOCAL_RANK only when this machine has a GPU for every rank (else
    # gloo: 2 ranks on 1 GPU would fail with "invalid device ordinal"). It reads LOCAL_RANK and LOCAL_WORLD_SIZE,
    # which mp.spawn does not set: on one machine the local rank is the rank.
    os.environ.setdefault("LOCAL_RANK", str(rank if local_rank is None else local_rank))
    os.environ.setdefault("LOCAL_WORLD_SIZE", str(world_size))
    backend, device = backend_and_device()  # also set_device(LOCAL_RANK), before anything touches CUDA
    # rank and world_size explicit; the address still comes from MASTER_ADDR/MASTER_PORT (env://)
    dist.init_process_group(backend, rank=rank, world_size=world_size)

    torch.manual_seed(0)  # the same starting weights on every rank (DDP would broadcast rank 0's anyway)
    model = DDP(nn.Linear(8, 1).to(device), device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1)
    inputs = torch.randn(64, 8, generator=data)
    targets = inputs.sum(dim=1, keepdim=True)
    my_inputs, my_targets = inputs[rank::world_size].to(device), targets[rank::world_size].to(device)  # my shard
    losses = []
    for _ in range(steps):
        loss = nn.functional.mse_loss(model(my_inputs), my_targets)
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients of all ranks here
        optimizer.step()
        losses.append(loss.item())
    print(f"rank {rank} of {world_size} ({launcher}): loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)

    # The check that training was data parallel: after the same averaged steps, every rank holds the same weights.
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.zeros_like(weights) for _ in range(world_size)]
    dist.all_gather(everyone, weights)
    if rank == 0:
        print("RESULT " + json.dumps({
            "launcher": launcher, "world_size": world_size, "environment": found,
            "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
            "weights_equal_on_every_rank": all(torch.equal(weights, w) for w in everyone)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":  # under torchrun: everything comes from the environment
    train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "torchrun", int(os.environ["LOCAL_RANK"]))
