"""Rank 0 saves, then every rank loads: without a barrier in between, the others read too soon (lesson 07).

    torchrun --standalone --nproc-per-node=2 ddp_scripts/save_then_load.py DIR
"""
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ddp_common import backend_and_device  # import before init_process_group

dist.init_process_group(backend_and_device()[0])
loaded = {}
for barrier in (False, True):
    path = Path(sys.argv[1]) / f"barrier_{barrier}.pt"
    if dist.get_rank() == 0:
        path.unlink(missing_ok=True)  # an earlier run's file would be read: worse still
    dist.barrier()  # the round starts with no file
    if dist.get_rank() == 0:
        time.sleep(2)  # a save takes a while: a large model, a slow or shared disk
        torch.save({"step": 100}, path)
    if barrier:
        dist.barrier()  # the fix: nobody reads before rank 0 has finished writing
    try:
        loaded[barrier] = torch.load(path, map_location="cpu", weights_only=True)["step"]
    except FileNotFoundError:
        loaded[barrier] = "FileNotFoundError"
everyone = [None] * dist.get_world_size()
dist.all_gather_object(everyone, loaded)
if dist.get_rank() == 0:
    print("RESULT " + json.dumps({"without_barrier": [r[False] for r in everyone],
                                  "with_barrier": [r[True] for r in everyone]}))
dist.destroy_process_group()
