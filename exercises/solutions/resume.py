"""A solution of exercises/resume.py: rank 0 writes (a temporary file, renamed onto the path: a reader sees the
old file or the new one, never half), everyone waits, every rank reads onto its own device."""
import os
from pathlib import Path

import torch
import torch.distributed as dist


def save_checkpoint(path, ddp_model, optimizer, epoch, step):
    if dist.get_rank() == 0:  # every rank holds the same weights: one writer
        temporary = Path(path).with_name(Path(path).name + ".tmp")
        with open(temporary, "wb") as f:
            torch.save({"model": ddp_model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "epoch": epoch, "step": step}, f)
            f.flush()
            os.fsync(f.fileno())
        temporary.replace(path)
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
    for epoch in range(start_epoch, epochs):
        sampler.set_epoch(epoch)  # the interrupted epoch's shuffle again, not epoch 0's
        for step, batch in enumerate(loader):
            if epoch == start_epoch and step < start_step:
                continue  # trained before the stop: neither again nor skipped
            train_step(batch)
            save_checkpoint(path, ddp_model, optimizer, epoch, step + 1)
