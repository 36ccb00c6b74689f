"""A wrong answer to resume: a barrier and a map_location, but one that maps nothing. map_location={} leaves every
tensor where it was saved: on GPUs, every rank loads rank 0's tensors onto cuda:0 (on the CPU it goes unnoticed)."""
from pathlib import Path

import torch
import torch.distributed as dist


def save_checkpoint(path, ddp_model, optimizer, epoch, step):
    if dist.get_rank() == 0:
        torch.save({"model": ddp_model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "epoch": epoch, "step": step}, path)
    dist.barrier()


def load_checkpoint(path, ddp_model, optimizer):
    checkpoint = torch.load(path, map_location={}, weights_only=True)
    ddp_model.module.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["epoch"], checkpoint["step"]


def train_loop(ddp_model, optimizer, sampler, loader, epochs, path, train_step):  # right: this mistake is elsewhere
    start_epoch, start_step = load_checkpoint(path, ddp_model, optimizer) if Path(path).exists() else (0, 0)
    for epoch in range(start_epoch, epochs):
        sampler.set_epoch(epoch)
        for step, batch in enumerate(loader):
            if epoch == start_epoch and step < start_step:
                continue
            train_step(batch)
            save_checkpoint(path, ddp_model, optimizer, epoch, step + 1)
