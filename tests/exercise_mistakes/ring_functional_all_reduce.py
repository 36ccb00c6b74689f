"""A wrong answer to ring_allreduce that no list of names refuses: torch's functional all-reduce, which reaches the
process group without going through torch.distributed.all_reduce. The check sees the collective it ran."""
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def ring_all_reduce(tensor):
    tensor.copy_(funcol.all_reduce(tensor, "sum", dist.group.WORLD))
