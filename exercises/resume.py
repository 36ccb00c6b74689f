"""Exercise (lesson 07): save a checkpoint mid-epoch and resume from it, under DDP.

Define
    save_checkpoint(path, ddp_model, optimizer, epoch, step)
    load_checkpoint(path, ddp_model, optimizer) -> (epoch, step)
Both are called on every rank. (epoch, step) is where training continues. The course's training loop saves in
the middle of an epoch, starts again from a new model and optimizer, loads, and finishes: the result must be
bit for bit the uninterrupted run's.

The check runs it at 2 and 3 ranks and watches torch.save and torch.load: only rank 0 may write, every rank
must wait for the file before reading, torch.load needs a map_location (the rank's own device), and
weights_only must not be turned off.

Check it:   python -m lessons.check resume
"""
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
