"""A solution of exercises/average_gradients.py: what DDP does after backward(), one parameter at a time."""
import torch
import torch.distributed as dist


def average_gradients(model: torch.nn.Module) -> None:
    world = dist.get_world_size()
    # parameters() yields a tied Parameter once; a frozen one (requires_grad=False) has no .grad to average.
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= world
