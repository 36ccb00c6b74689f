"""A typical mistake in exercises/resume.py: the resumed loop starts at epoch 0 again (TODO 4 undone), though it
skips the done steps of the interrupted epoch rightly; save and load are right."""
from pathlib import Path

import torch
import torch.distributed as dist


def save_checkpoint(path, ddp_model, optimizer, epoch, step):
    if dist.get_rank() == 0:  # every rank holds the same weights: one writer
        torch.save({"model": ddp_model.module.state_dict(),  # .module: keys without "module."
                    "optimizer": optimizer.state_dict(), "epoch": epoch, "step": step}, path)
    dist.barrier()  # nobody reads (or exits, or deletes the file) before rank 0 has finished writing


def load_checkpoint(path, ddp_model, optimizer):
    device = next(ddp_model.parameters()).device  # this rank's own device (cuda:LOCAL_RANK on a GPU)
    checkpoint = torch.load(path, map_location=device, weights_only=True)
    ddp_model.module.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["epoch"], checkpoint["step"]


def train_loop(ddp_model, optimizer, sampler, loader, epochs, path, train_step):
    start_epoch, start_step = 0, 0
    if Path(path).exists():  # a run that stopped: go on from where its last checkpoint says
        start_epoch, start_step = load_checkpoint(path, ddp_model, optimizer)
    for epoch in range(epochs):  # the mistake: from epoch 0 again, not from the checkpoint's epoch
        sampler.set_epoch(epoch)
        for step, batch in enumerate(loader):
            if epoch == start_epoch and step < start_step:  # right: only in the interrupted epoch
                continue
            train_step(batch)
            save_checkpoint(path, ddp_model, optimizer, epoch, step + 1)
