"""Exercise (lesson 07): save a checkpoint mid-epoch and resume from it, under DDP.

Define
    save_checkpoint(path, ddp_model, optimizer, epoch, step)
    load_checkpoint(path, ddp_model, optimizer) -> (epoch, step)
    train_loop(ddp_model, optimizer, sampler, loader, epochs, path, train_step)
All are called on every rank. (epoch, step) is where training continues. The course's training loop saves in
the middle of an epoch, starts again from a new model and optimizer, loads, and finishes: the result must be
bit for bit the uninterrupted run's. Then your own train_loop does the same: it calls train_step(batch) for each
batch and saves after each step; the check stops it mid-epoch, and a new model's train_loop must train exactly
the batches the uninterrupted run trained after that point: none twice, none skipped, in the same order.

The check runs it at 2 and 3 ranks and watches torch.save and torch.load: only rank 0 may write, every rank
must wait for the file before reading, torch.load needs a map_location that puts every tensor on this rank (its
device, or "cpu"), and weights_only must not be turned off.

Check it:   python -m lessons check resume
"""
from pathlib import Path

import torch
import torch.distributed as dist  # noqa: F401  (you will need it)


def save_checkpoint(path, ddp_model, optimizer, epoch, step):
    # TODO 1: which rank writes? What must the others wait for?
    # TODO 2: what besides the weights does an exact resume need?
    torch.save({"model": ddp_model.module.state_dict(), "epoch": epoch, "step": step}, path)


def load_checkpoint(path, ddp_model, optimizer):
    # TODO 3: onto which device should this rank load the tensors?
    checkpoint = torch.load(path, weights_only=True)
    ddp_model.module.load_state_dict(checkpoint["model"])
    return checkpoint["epoch"], checkpoint["step"]


def train_loop(ddp_model, optimizer, sampler, loader, epochs, path, train_step):
    start_epoch, start_step = 0, 0
    if Path(path).exists():
        start_epoch, start_step = load_checkpoint(path, ddp_model, optimizer)
    for epoch in range(epochs):  # TODO 4: where does a resumed run start?
        sampler.set_epoch(epoch)
        for step, batch in enumerate(loader):
            # TODO 5: which steps of the resumed epoch were trained before the stop?
            train_step(batch)
            save_checkpoint(path, ddp_model, optimizer, epoch, step + 1)
