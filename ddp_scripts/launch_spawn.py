"""Start the ranks from Python itself: torch.multiprocessing, no launcher in between.

    python ddp_scripts/launch_spawn.py --start-method spawn    # mp.spawn: fresh interpreters
    python ddp_scripts/launch_spawn.py --start-method fork     # start_processes(start_method="fork")
    MASTER_ADDR=node0 MASTER_PORT=29500 python ddp_scripts/launch_spawn.py --nnodes=2 --node-rank=0  # 10b
"""
import argparse
import os
import socket

import torch
import torch.multiprocessing as mp

from tiny_train import train  # importable by name: spawn's children import it, they cannot unpickle a lambda


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank(local_index, node_rank, nprocs, nnodes, launcher):  # mp passes the local index first
    os.environ["LOCAL_WORLD_SIZE"] = str(nprocs)  # processes on this node, for backend_and_device()
    rank = node_rank * nprocs + local_index  # what torchrun computes for us
    train(rank, nnodes * nprocs, launcher, local_rank=local_index)


if __name__ == "__main__":  # required with spawn: each child imports this file, and must not start ranks itself
    parser = argparse.ArgumentParser()
    parser.add_argument("--start-method", choices=["spawn", "fork"], default="spawn")
    parser.add_argument("--nprocs", type=int, default=torch.cuda.device_count() or 2)  # per node
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)  # 0 on the first machine, 1 on the next, ...
    args = parser.parse_args()
    # No launcher sets these for us: the children inherit them and init_process_group reads them (env://).
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))  # several nodes: set it, the same on every node
    launcher = "mp.spawn" if args.start_method == "spawn" else "start_processes(fork)"
    # Each child runs run_rank(i, *args) with i = 0..nprocs-1.
    rank_args = (args.node_rank, args.nprocs, args.nnodes, launcher)
    if args.start_method == "spawn":
        mp.spawn(run_rank, args=rank_args, nprocs=args.nprocs)
    else:  # fork copies this process: fast, but unsafe once CUDA is initialised in the parent
        mp.start_processes(run_rank, args=rank_args, nprocs=args.nprocs, start_method="fork")
