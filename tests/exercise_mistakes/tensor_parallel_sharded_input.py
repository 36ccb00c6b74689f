"""A typical wrong answer to exercises/tensor_parallel.py, a data-parallel habit: the input declared split by rows,
where every rank is given it whole. It runs, and is wrong."""
from torch.distributed.tensor import Shard  # noqa: F401
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel


def plan(block):
    return {"gate": ColwiseParallel(input_layouts=Shard(0)), "up": ColwiseParallel(input_layouts=Shard(0)),
            "down": RowwiseParallel()}
