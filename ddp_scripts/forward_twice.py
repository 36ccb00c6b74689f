"""Two forward passes before one backward (a GAN's discriminator on fake and real), with BatchNorm.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/forward_twice.py

Each way, on a fresh model, two training steps:
  two-forwards                out1 = model(a); out2 = model(b); loss(out1, out2).backward()
  as-older-ddp                the same, with the broadcast done in place, as DDP did before torch's fix
  forward_sync_buffers=False  fix 1: no broadcast in forward
  one-forward                 fix 2: one forward on torch.cat([a, b]), split afterwards
"""
import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_common import backend_and_device  # import before init_process_group

WAYS = ["two-forwards", "as-older-ddp", "forward_sync_buffers=False", "one-forward"]


def broadcast_buffers_in_place(module):
    """What DDP's forward did before torch's fix: copy rank 0's buffers into ours, in place."""
    with torch.no_grad():
        for buffer in module.buffers():
            received = buffer.clone()
            dist.broadcast(received, src=0)
            buffer.copy_(received)  # in place: autograd's version counter of the buffer goes up


def train_two_steps(way: str, device) -> str:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).to(device)
    model = DDP(net, forward_sync_buffers=way not in ("as-older-ddp", "forward_sync_buffers=False"))
    a, b = torch.randn(8, 4, device=device), torch.randn(8, 4, device=device)
    try:
        for _ in range(2):
            if way == "one-forward":
                out1, out2 = model(torch.cat([a, b])).split(len(a))
            else:
                if way == "as-older-ddp":
                    broadcast_buffers_in_place(net)
                out1 = model(a)
                if way == "as-older-ddp":
                    broadcast_buffers_in_place(net)  # the second forward's broadcast
                out2 = model(b)
            (out1 - out2).pow(2).mean().backward()
        return "ok"
    except RuntimeError as error:
        return f"{type(error).__name__}: {str(error).split(':')[0]}"


def main():
    backend, device = backend_and_device()
    dist.init_process_group(backend)
    rank = dist.get_rank()
    outcomes = {}
    for way in WAYS:
        outcomes[way] = train_two_steps(way, device)
        print(f"rank {rank}: {way:<26} {outcomes[way]}")
    if rank == 0:
        print("RESULT " + json.dumps({"torch": torch.__version__.split("+")[0], "outcomes": outcomes}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
