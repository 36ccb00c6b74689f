"""Five layouts of one model on 4 ranks, each checked against one process: what each rank holds, and what one
training step sends.

    torchrun --standalone --nproc-per-node=4 layouts.py

DDP, FSDP2 (4-way shard), HSDP (2 replicas x 2 shards), TP (4-way tensor parallel) and FSDP x TP (2-way FSDP over
2-way TP: the 2-D layout of large-model training). The model is two MLP blocks; the global batch is 8 rows, split
over the data-parallel ranks (TP ranks of one group see the same rows). After 2 SGD steps every layout's parameters
are compared with one process trained on the whole batch; one step's collectives are counted by CommDebugMode.
"""
import copy
import json
import logging
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_common  # a clean exit, and the device

STEPS, ROWS, WIDTH, HIDDEN = 2, 8, 16, 64
# Two notes torch prints that don't apply here: FSDP2's caution about in-place ops on a returned view (none here),
# and DTensor's that gathering a 2-D sharded parameter for the comparison takes two all-gathers (it is not a step).
warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
backend, device = ddp_common.backend_and_device()  # a GPU for each rank, else gloo on the CPU
dist.init_process_group(backend)
device_type = device.type
world = init_device_mesh(device_type, (4,), mesh_dim_names=("all",))
grid = init_device_mesh(device_type, (2, 2), mesh_dim_names=("dp", "tp"))
rank = dist.get_rank()


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(WIDTH, HIDDEN), torch.nn.Linear(HIDDEN, WIDTH)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


torch.manual_seed(0)
reference = torch.nn.Sequential(Block(), Block()).to(device_type)
batches = [(torch.randn(ROWS, WIDTH, device=device_type), torch.randn(ROWS, WIDTH, device=device_type))
           for _ in range(STEPS)]  # the same global batches on every rank


def tensor_parallel(model, mesh):
    for block in model:
        parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return model


def fsdp(model, mesh):
    for block in model:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


# name: (the model, the data-parallel rank and size: which rows of the batch this rank trains on)
dp_rank, dp_size = grid.get_coordinate()[0], 2
layouts = {
    "DDP": (DDP(copy.deepcopy(reference)), rank, 4),
    "FSDP2": (fsdp(copy.deepcopy(reference), world), rank, 4),
    "HSDP 2x2": (fsdp(copy.deepcopy(reference), grid), rank, 4),
    "TP": (tensor_parallel(copy.deepcopy(reference), world), 0, 1),
    "FSDP x TP": (fsdp(tensor_parallel(copy.deepcopy(reference), grid["tp"]), grid["dp"]), dp_rank, dp_size),
}
one = copy.deepcopy(reference)
one_optimizer = torch.optim.SGD(one.parameters(), lr=0.1)
for x, y in batches:
    one_optimizer.zero_grad()
    F.mse_loss(one(x), y).backward()
    one_optimizer.step()


def full(p):
    return p.full_tensor() if isinstance(p, DTensor) else p


table = {}
for name, (model, part, parts) in layouts.items():
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(batches):
        rows = slice(part * ROWS // parts, (part + 1) * ROWS // parts)
        with CommDebugMode() as comms:
            optimizer.zero_grad()
            F.mse_loss(model(x[rows]), y[rows]).backward()
            optimizer.step()
        if step == 0:
            sent = {}
            for op, n in comms.get_comm_counts().items():  # torch's op names, c10d's and DTensor's, as one word
                kind = str(op).replace("_", "").replace("base", "").split(".")[-1]
                kind = {"allgather": "all-gather", "allgatherintotensor": "all-gather", "allreduce": "all-reduce",
                        "reducescatter": "reduce-scatter", "reducescattertensor": "reduce-scatter"}.get(kind, kind)
                sent[kind] = sent.get(kind, 0) + n
    diff = max((full(p).detach() - q.detach()).abs().max().item()
               for p, q in zip(model.parameters(), one.parameters()))
    held = sum((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size()
               for p in model.parameters())
    table[name] = {"param_bytes": held, "collectives_per_step": sent, "max_abs_diff": diff, "matches": diff < 1e-5}
if rank == 0:
    whole = sum(p.numel() * p.element_size() for p in reference.parameters())
    print(f"{'layout':<10}{'params/rank':>12}{'of DDP':>8}  same as 1 process  collectives in one step")
    for name, row in table.items():
        print(f"{name:<10}{row['param_bytes']:>12,}{row['param_bytes'] / whole:>8.2f}  {row['matches']!s:<17}  "
              f"{row['collectives_per_step']}")
    print("RESULT " + json.dumps({"world_size": dist.get_world_size(), "layouts": table, "param_bytes_ddp": whole}))
dist.destroy_process_group()
