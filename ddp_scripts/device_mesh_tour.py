"""DeviceMesh and DTensor on 4 ranks: what each rank holds under Shard, Replicate and Partial, and what a
redistribute costs.

    torchrun --standalone --nproc-per-node=4 device_mesh_tour.py

A 2 x 2 mesh named ("replicate", "shard"): rank r sits at (r // 2, r % 2). A placement says, per mesh dimension,
how a tensor lies along it: Shard(d) cuts it along its dim d, Replicate() gives every rank all of it, Partial()
gives every rank a summand (the full tensor is their sum). redistribute() changes placements with the collective
that does it, counted here by CommDebugMode.
"""
import json

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

import ddp_common  # a clean exit, and the device

backend, device = ddp_common.backend_and_device()  # a GPU for each rank, else gloo on the CPU
dist.init_process_group(backend)
device_type = device.type
mesh = init_device_mesh(device_type, (2, 2), mesh_dim_names=("replicate", "shard"))
rank = dist.get_rank()
full = torch.arange(16.0, device=device_type).reshape(4, 4)  # the same on every rank: distribute_tensor needs it


def held(t):
    return t.to_local().tolist()


lines = [f"rank {rank} at {mesh.get_coordinate()}:"]
sharded = distribute_tensor(full, mesh, [Replicate(), Shard(0)])  # rows cut along "shard", copied along "replicate"
lines.append(f"  [Replicate(), Shard(0)]  holds rows {held(sharded)}")
both = distribute_tensor(full, mesh, [Shard(1), Shard(0)])  # cut both ways: a quarter each
lines.append(f"  [Shard(1), Shard(0)]     holds {held(both)}")
shard_index = mesh.get_coordinate()[1]  # the same along "replicate", as Replicate() promises
summand = DTensor.from_local(torch.full((4,), float(shard_index + 1), device=device_type), mesh,
                             [Replicate(), Partial()])
lines.append(f"  [Replicate(), Partial()] holds {held(summand)}: a summand, the full tensor is their sum")

costs = {}
for name, start, target in (("Shard(0) -> Replicate() along shard", sharded, [Replicate(), Replicate()]),
                            ("Partial() -> Replicate() along shard", summand, [Replicate(), Replicate()]),
                            ("Partial() -> Shard(0) along shard", summand, [Replicate(), Shard(0)])):
    with CommDebugMode() as comms:
        moved = start.redistribute(mesh, target)
    costs[name] = {str(op).split(".")[-1]: n for op, n in comms.get_comm_counts().items()}
    lines.append(f"  {name}: holds {held(moved)}, by {costs[name]}")
gathered, summed = sharded.full_tensor(), summand.full_tensor()  # collectives: every rank calls them
print("\n".join(lines))
if rank == 0:
    print("RESULT " + json.dumps({"world_size": dist.get_world_size(), "costs": costs,
                                  "sharded_gathers_to_full": torch.equal(gathered, full),
                                  "partial_sum": summed.tolist()}))
dist.destroy_process_group()
