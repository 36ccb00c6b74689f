"""Exercise (lesson 03): average the gradients by hand, as DDP does.

Define average_gradients(model) -> None. It is called on every rank after loss.backward() and before
optimizer.step(); afterwards every rank must hold the average of all ranks' gradients, exactly as with torch's
DistributedDataParallel.

The check runs it at 3 ranks for 3 SGD steps, each rank on its own data, on a model with a tied weight (one
Parameter used by two layers), a frozen layer (requires_grad=False) and plain layers, and compares every
gradient with DDP's.

Check it:   python -m lessons check average_gradients
"""
import torch
import torch.distributed as dist  # noqa: F401  (you will need it)


def average_gradients(model: torch.nn.Module) -> None:
    # TODO: for each parameter of the model, sum its .grad over all ranks (dist.all_reduce) and divide by the
    #       world size. Which parameters have a .grad at all?
    pass
