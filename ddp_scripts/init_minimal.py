"""Three ways for ranks to meet, one after the other; in your script, pick one (lesson 10).

    torchrun --standalone --nproc-per-node=2 ddp_scripts/init_minimal.py FREE_PORT /fresh/dir/init
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist

rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])  # who I am: from the launcher
port, path = sys.argv[1], sys.argv[2]  # a port nobody uses, a file path no run has used
for init_method in ("env://",  # the default: reads MASTER_ADDR and MASTER_PORT, which torchrun sets
                    f"tcp://127.0.0.1:{port}",  # rank 0 listens at this address, the others connect to it
                    f"file://{path}"):  # a file that every rank sees (a shared file system)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(minutes=2))  # wait at most this for the others
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)  # the group formed: 1 + 2 = 3 on every rank
    print(f"rank {rank}: {init_method} -> all_reduce of rank+1 = {total.item():g}")
    dist.destroy_process_group()  # on every rank, before the next init_process_group
