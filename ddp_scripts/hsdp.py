"""HSDP: FSDP2's fully_shard on a 2-D mesh, replicas of shards, checked against DDP on the same batches.

    torchrun --standalone --nproc-per-node=4 hsdp.py --replicate 2 --shard 2

World = R x S ranks on a mesh ("replicate", "shard"): the parameters are sharded S ways within a replica group (as
FSDP2 does) and replicated R ways across them (as DDP does); the gradients are reduce-scattered within a shard group,
then all-reduced across replicas. On N nodes of G GPUs: --replicate N --shard G, so the all-gathers stay
on a node, and only the all-reduce crosses nodes. Trained as DDP, as FSDP2 on all R x S ranks and as
HSDP from the same weights on the same batches, then compared.
"""
import argparse
import copy
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_common  # a clean exit, and the device

parser = argparse.ArgumentParser()
parser.add_argument("--replicate", type=int, default=2, help="R: replica groups (DDP's dimension)")
parser.add_argument("--shard", type=int, default=2, help="S: ranks that share one copy (FSDP's dimension)")
parser.add_argument("--steps", type=int, default=3)
options = parser.parse_args()

world_size = int(os.environ["WORLD_SIZE"])
if options.replicate * options.shard != world_size:
    raise SystemExit(f"--replicate {options.replicate} x --shard {options.shard} must be the world size, {world_size}")
backend, device = ddp_common.backend_and_device()  # a GPU for each rank, else gloo on the CPU
dist.init_process_group(backend)
device_type = device.type
mesh = init_device_mesh(device_type, (options.replicate, options.shard), mesh_dim_names=("replicate", "shard"))
flat = init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))  # FSDP2 on one dimension
rank = dist.get_rank()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                            torch.nn.Linear(32, 4)).to(device_type)


def sharded(mesh):
    copied = copy.deepcopy(model)
    for layer in copied:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(copied, mesh=mesh)


runs = {"ddp": DDP(copy.deepcopy(model)), "fsdp2": sharded(flat), "hsdp": sharded(mesh)}
optimizers = {name: torch.optim.SGD(m.parameters(), lr=0.1) for name, m in runs.items()}
for step in range(options.steps):
    generator = torch.Generator().manual_seed(1000 * step + rank)  # each rank its own batch, as a sampler gives
    x = torch.randn(8, 16, generator=generator).to(device_type)
    y = torch.randn(8, 4, generator=generator).to(device_type)
    for name, m in runs.items():
        optimizers[name].zero_grad()
        F.mse_loss(m(x), y).backward()
        optimizers[name].step()


def full(p):
    return p.full_tensor() if isinstance(p, DTensor) else p


def local_bytes(m):
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size() for p in m.parameters())


reference = [p.detach() for p in runs["ddp"].module.parameters()]
differences = {name: max((full(p).detach() - q).abs().max().item() for p, q in zip(runs[name].parameters(), reference))
               for name in ("fsdp2", "hsdp")}
placements = [str(p.placements) for p in runs["hsdp"].parameters()][:1]
param_bytes = {name: local_bytes(m) for name, m in runs.items()}
print(f"rank {rank}: mesh coordinate {mesh.get_coordinate()}, holds {param_bytes['hsdp']:,} parameter bytes "
      f"under HSDP (DDP {param_bytes['ddp']:,}, FSDP2 {param_bytes['fsdp2']:,})")
if rank == 0:
    print("RESULT " + json.dumps({
        "world_size": world_size, "replicate": options.replicate, "shard": options.shard, "steps": options.steps,
        "matches_ddp": all(d < 1e-5 for d in differences.values()), "max_abs_diff": differences,
        "param_bytes_per_rank": param_bytes, "hsdp_placements": placements[0]}))
dist.destroy_process_group()
