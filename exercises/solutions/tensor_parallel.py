"""A solution of exercises/tensor_parallel.py: gate and up split their outputs (Colwise), down its inputs (Rowwise).

The hidden layer is then never whole on any rank: silu(gate(x)) * up(x) is elementwise, so each rank multiplies its
own slices, and down's partial outputs are summed by the one all-reduce of RowwiseParallel.
"""
import torch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel


class GatedMLP(torch.nn.Module):
    def __init__(self, width: int = 16, hidden: int = 32):
        super().__init__()
        self.gate = torch.nn.Linear(width, hidden)
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def plan(block: GatedMLP) -> dict:
    return {"gate": ColwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()}
