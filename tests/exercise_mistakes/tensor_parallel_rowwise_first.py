"""A typical wrong answer to exercises/tensor_parallel.py: Rowwise before Colwise: the styles swapped."""
from torch.distributed.tensor import Shard  # noqa: F401
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel


def plan(block):
    return {"gate": RowwiseParallel(), "up": RowwiseParallel(), "down": ColwiseParallel()}
