"""A typical wrong answer to resume: rank 0 saves, and nobody waits for it before loading."""
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
