"""Which rank am I? The variables torchrun sets, and the arithmetic that ties them together.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/where_am_i.py
    # two "nodes" on one machine, each in its own terminal: --node-rank=0 in one, --node-rank=1 in the other
    torchrun --nnodes=2 --node-rank=0 --nproc-per-node=2 --master-addr=127.0.0.1 --master-port=29500 ddp_scripts/where_am_i.py
"""
import json
import os
import socket

import torch.distributed as dist

from ddp_common import backend_and_device  # import before init_process_group


def main():
    # Set by torchrun for every worker, before init_process_group: nothing here needs a process group yet.
    rank = int(os.environ["RANK"])  # global: unique across all nodes
    local_rank = int(os.environ["LOCAL_RANK"])  # on this node: which GPU to use
    world_size = int(os.environ["WORLD_SIZE"])
    node_rank = int(os.environ["GROUP_RANK"])  # this node's rank: torchrun's --node-rank, or the rendezvous's choice
    procs_per_node = int(os.environ["LOCAL_WORLD_SIZE"])  # --nproc-per-node
    nodes = int(os.environ["GROUP_WORLD_SIZE"])  # how many agents (nodes) joined
    role_rank = int(os.environ["ROLE_RANK"])  # the rank among workers of the same role: one role here

    rank_from_parts = node_rank * procs_per_node + local_rank
    world_from_parts = nodes * procs_per_node
    print(f"node {node_rank} local {local_rank} -> rank {rank} of {world_size} "
          f"(= {node_rank}*{procs_per_node}+{local_rank}: {rank == rank_from_parts}) on {socket.gethostname()}")

    backend, _ = backend_and_device()
    dist.init_process_group(backend)  # env://, from MASTER_ADDR and MASTER_PORT
    me = {"rank": rank, "local_rank": local_rank, "node_rank": node_rank, "role_rank": role_rank,
          "arithmetic_holds": rank == rank_from_parts == role_rank and world_size == world_from_parts}
    everyone = [None] * world_size
    dist.all_gather_object(everyone, me)  # the group formed: every rank can hear every other

    if rank == 0:
        print("RESULT " + json.dumps({
            "world_size": world_size, "nodes": nodes, "procs_per_node": procs_per_node,
            "ranks": everyone,  # in global-rank order
            "group_formed": [r["rank"] for r in everyone] == list(range(world_size)),
            "arithmetic_holds": all(r["arithmetic_holds"] for r in everyone),
        }))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
