"""A solution of exercises/resume.py: rank 0 writes, everyone waits, every rank reads onto its own device."""
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
