"""After FSDP2 and destroy_process_group(), does the group live on, and does ddp_common's exit hook free it?

One process, a world of 1 on an in-process store: the group's lifetime is the question, not a launcher's.

    python tests/scripts/mesh_holds_group.py
"""
import gc
import json
import sys
import weakref
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ddp_scripts"))
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

import ddp_common  # noqa: E402


def shard_and_gather():
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return [v.full_tensor().sum().item() for v in model.state_dict().values()]


dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # no torchrun for one process
group = weakref.ref(dist.group.WORLD)
shard_and_gather()
dist.destroy_process_group()
gc.collect()
alive_after_collect = group() is not None
ddp_common.release_process_groups()
print("RESULT " + json.dumps({"alive_after_collect": alive_after_collect, "alive_after_release": group() is not None}))
