"""Tensor parallelism on one MLP: ColwiseParallel then RowwiseParallel, checked against the same MLP in one process.

    torchrun --standalone --nproc-per-node=2 tensor_parallel.py --hidden 64 [--plan right|rowwise-first|sharded-input]

Every rank holds 1/N of each weight: the first Linear's output rows (Colwise), the second's input columns (Rowwise).
Forward: the input is replicated, each rank computes its slice of the hidden layer, and one all-reduce sums the
second Linear's partial outputs. The script counts the collectives of one forward and one backward (CommDebugMode),
and compares outputs and gradients with the single-process MLP. The wrong plans run without an error, and are wrong.
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

parser = argparse.ArgumentParser()
parser.add_argument("--hidden", type=int, default=64, help="the hidden width: a multiple of the world size")
parser.add_argument("--plan", default="right", choices=["right", "rowwise-first", "sharded-input"])
options = parser.parse_args()

device_type = "cuda" if torch.cuda.is_available() else "cpu"
if device_type == "cuda":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh(device_type, (int(os.environ["WORLD_SIZE"]),), mesh_dim_names=("tp",))
rank, world_size = dist.get_rank(), dist.get_world_size()


class MLP(torch.nn.Module):
    def __init__(self, width, hidden):
        super().__init__()
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


torch.manual_seed(0)  # the same weights and the same input on every rank, and in the reference
reference = MLP(16, options.hidden).to(device_type)
model = MLP(16, options.hidden).to(device_type)
model.load_state_dict(reference.state_dict())
x = torch.randn(8, 16, device=device_type)

plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
if options.plan == "rowwise-first":  # the styles swapped: each rank multiplies by the wrong slice
    plan = {"up": RowwiseParallel(), "down": ColwiseParallel()}
parallelize_module(model, mesh, plan)
inputs = x
if options.plan == "sharded-input":  # each rank passes its own rows of the batch, where Colwise expects it whole
    inputs = x.chunk(world_size)[rank]

with CommDebugMode() as forward_comms:
    out = model(inputs)
with CommDebugMode() as backward_comms:
    out.sum().backward()
out_full = out.full_tensor() if isinstance(out, DTensor) else out
expected = reference(x)
expected.sum().backward()


def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


same_out = out_full.shape == expected.shape and torch.allclose(out_full, expected, atol=1e-5)
grad_diff = max((full(p.grad) - q.grad).abs().max().item() for p, q in zip(model.parameters(),
                                                                        reference.parameters()))
counts = {str(op).split(".")[-1]: n for op, n in forward_comms.get_comm_counts().items()}
backward = {str(op).split(".")[-1]: n for op, n in backward_comms.get_comm_counts().items()}
held = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in model.parameters())
print(f"rank {rank}: holds {held} of {sum(p.numel() for p in reference.parameters())} parameters; output "
      f"{tuple(out_full.shape)}, matches one process: {same_out}")
if rank == 0:
    print("RESULT " + json.dumps({
        "world_size": world_size, "plan": options.plan, "hidden": options.hidden,
        "matches_single_process": bool(same_out and grad_diff < 1e-5),
        "max_grad_diff": grad_diff, "allreduces_per_forward": counts.get("all_reduce", 0),
        "forward_collectives": counts, "backward_collectives": backward, "params_per_rank": held}))
dist.destroy_process_group()
