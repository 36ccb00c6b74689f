"""Start the ranks from Python itself: torch.multiprocessing, no launcher in between.

    python ddp_scripts/launch_spawn.py --start-method spawn    # mp.spawn: fresh interpreters
    python ddp_scripts/launch_spawn.py --start-method fork     # start_processes(start_method="fork")
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


if __name__ == "__main__":  # required with spawn: each child imports this file, and must not start ranks itself
    parser = argparse.ArgumentParser()
    parser.add_argument("--start-method", choices=["spawn", "fork"], default="spawn")
    parser.add_argument("--nprocs", type=int, default=torch.cuda.device_count() or 2)
    args = parser.parse_args()
    # No launcher sets these for us: the children inherit them and init_process_group reads them (env://).
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    launcher = "mp.spawn" if args.start_method == "spawn" else "start_processes(fork)"
    # Each child runs train(i, *args) with i = 0..nprocs-1: the rank comes as the first argument.
    if args.start_method == "spawn":
        mp.spawn(train, args=(args.nprocs, launcher), nprocs=args.nprocs)
    else:  # fork copies this process: fast, but unsafe once CUDA is initialised in the parent
        mp.start_processes(train, args=(args.nprocs, launcher), nprocs=args.nprocs, start_method="fork")
