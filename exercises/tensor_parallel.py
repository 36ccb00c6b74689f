"""Exercise (lesson 15): the tensor-parallel plan of a gated MLP block.

Define plan(block) -> dict: {name of a submodule: a ParallelStyle}, for
parallelize_module(block, mesh, plan(block)). The block (below, as the check builds it) computes
down(silu(gate(x)) * up(x)) with three Linear layers. On N ranks it must compute what it computes in one process,
the input x given whole to every rank, with one all-reduce per forward.

The check runs your plan at 2 and 4 ranks against the block in one process (outputs and gradients), and counts the
collectives of a forward. It names the mistake: a Linear in the wrong style or order, one left out, or an input
layout that isn't the whole (replicated) input.

Check it:   python -m lessons check tensor_parallel
"""
import torch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel  # noqa: F401  (you will need them)


class GatedMLP(torch.nn.Module):
    def __init__(self, width: int = 16, hidden: int = 32):
        super().__init__()
        self.gate = torch.nn.Linear(width, hidden)
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def plan(block: GatedMLP) -> dict:
    # TODO: which Linear layers split their output features (each rank computes a slice of the hidden layer), and
    #       which one splits its input features and sums the ranks' partial outputs?
    raise NotImplementedError("write the plan: {'gate': ..., 'up': ..., 'down': ...}")
