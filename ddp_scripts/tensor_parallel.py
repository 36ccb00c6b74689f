"""Tensor parallelism on one MLP: ColwiseParallel then RowwiseParallel, checked against the same MLP in one process.

    torchrun --standalone --nproc-per-node=2 tensor_parallel.py --hidden 64 [--plan right,sharded-input]

Each rank holds 1/N of each weight: the first Linear's output rows (Colwise), the second's input columns (Rowwise).
Per plan: one forward's collectives (CommDebugMode), outputs and gradients against the single-process MLP.
"""
import argparse
import json
import logging
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import ddp_common  # a clean exit, and the device

PLANS = ("right", "rowwise-first", "sharded-input")
logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)  # logs rowwise-first's error: caught
parser = argparse.ArgumentParser()
parser.add_argument("--hidden", type=int, default=64, help="the hidden width, a multiple of the world size")
parser.add_argument("--plan", default="right", help=f"one or more of {', '.join(PLANS)}, comma-separated")
options = parser.parse_args()
plans = options.plan.split(",")
if not set(plans) <= set(PLANS):
    raise SystemExit(f"--plan takes {', '.join(PLANS)}, got {options.plan}")

backend, device = ddp_common.backend_and_device()  # a GPU for each rank, else gloo on the CPU
dist.init_process_group(backend)
device_type = device.type
mesh = init_device_mesh(device_type, (int(os.environ["WORLD_SIZE"]),), mesh_dim_names=("tp",))
rank, world_size = dist.get_rank(), dist.get_world_size()


class MLP(torch.nn.Module):
    def __init__(self, width, hidden):
        super().__init__()
        self.up = torch.nn.Linear(width, hidden)
        self.down = torch.nn.Linear(hidden, width)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


torch.manual_seed(0)  # the same weights and the same input on every rank, and in the reference
reference = MLP(16, options.hidden).to(device_type)
x = torch.randn(8, 16, device=device_type)
expected = reference(x)
expected.sum().backward()
results = {}
for plan in plans:
    model = MLP(16, options.hidden).to(device_type)
    model.load_state_dict(reference.state_dict())
    styles = {"up": ColwiseParallel(), "down": RowwiseParallel()}
    if plan == "rowwise-first":  # the styles swapped: the shapes don't meet
        styles = {"up": RowwiseParallel(), "down": ColwiseParallel()}
    parallelize_module(model, mesh, styles)
    inputs = x.chunk(world_size)[rank] if plan == "sharded-input" else x  # each rank its rows: a DP habit
    try:
        with CommDebugMode() as forward_comms:
            out = model(inputs)
        with CommDebugMode() as backward_comms:
            out.sum().backward()
    except RuntimeError as error:
        results[plan] = {"matches_single_process": False, "error": str(error).splitlines()[0][:120]}
        continue
    out_full = full(out)
    same_out = out_full.shape == expected.shape and torch.allclose(out_full, expected, atol=1e-5)
    grad_diff = max((full(p.grad) - q.grad).abs().max().item() for p, q in zip(model.parameters(),
                                                                            reference.parameters()))
    counts = {str(op).split(".")[-1]: n for op, n in forward_comms.get_comm_counts().items()}
    held = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in model.parameters())
    print(f"rank {rank}, plan {plan}: holds {held} of {sum(p.numel() for p in reference.parameters())} parameters;"
          f" output {tuple(out_full.shape)}, matches one process: {same_out}")
    results[plan] = {"matches_single_process": bool(same_out and grad_diff < 1e-5), "max_grad_diff": grad_diff,
                     "allreduces_per_forward": counts.get("all_reduce", 0), "forward_collectives": counts,
                     "backward_collectives": {str(op).split(".")[-1]: n
                                              for op, n in backward_comms.get_comm_counts().items()},
                     "params_per_rank": held}
if rank == 0:
    print("RESULT " + json.dumps({"world_size": world_size, "plan": plans[0], "hidden": options.hidden,
                                  **results[plans[0]], "plans": results}))
dist.destroy_process_group()
