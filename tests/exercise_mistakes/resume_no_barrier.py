"""A typical wrong answer to resume: rank 0 saves, and nobody waits for it before loading."""
from pathlib import Path

import torch
import torch.distributed as dist


def save_checkpoint(path, ddp_model, optimizer, epoch, step):
    if dist.get_rank() == 0:
        torch.save({"model": ddp_model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "epoch": epoch, "step": step}, path)


def load_checkpoint(path, ddp_model, optimizer):
    checkpoint = torch.load(path, map_location=next(ddp_model.parameters()).device, weights_only=True)
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
