"""A wrong answer to resume: a barrier and a map_location, but one that maps nothing. map_location={} leaves every
tensor where it was saved: on GPUs, every rank loads rank 0's tensors onto cuda:0 (on the CPU it goes unnoticed)."""
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
