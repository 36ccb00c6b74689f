"""Three ways for ranks to find each other (init_minimal.py, instrumented for the tests and the stale file).

    python ddp_scripts/init_methods.py --init-method env     # or tcp, or file

It forks its ranks itself: no torchrun, so nothing is set for it.
"""
import argparse
import datetime
import os
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


STALE = " (the file was there before this run: delete it, or use a fresh path)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank(index, ranks, world_size, init_method, timeout_s, crash_after_init):
    rank = ranks[index]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))  # default: 30 min (gloo)
    if crash_after_init:
        os._exit(1)  # dies without destroy_process_group(): as a killed or crashed job does
    value = torch.tensor([rank + 1.0])
    dist.all_reduce(value)
    print(f"rank {rank}: {init_method} -> all_reduce of rank+1 = {value.item():g}", flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--init-method", choices=["env", "tcp", "file"], required=True)
    parser.add_argument("--file", help="file:// path (default: a file in a fresh temporary directory)")
    parser.add_argument("--address", help="tcp:// address (default: 127.0.0.1 and a free port)")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--ranks", help="start only these ranks, e.g. 1 (default: all)")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds for the ranks to meet and finish; also init_process_group(timeout=)")
    parser.add_argument("--crash-after-init", action="store_true", help="ranks exit without cleaning up")
    parser.add_argument("--reuse-stale-file", action="store_true", help="use a --file that exists (see STALE)")
    args = parser.parse_args()

    path = None
    if args.init_method == "env":  # what torchrun would set: here we set it ourselves
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(free_port())
        init_method = "env://"
    elif args.init_method == "tcp":
        init_method = "tcp://" + (args.address or f"127.0.0.1:{free_port()}")
    else:
        if args.file:
            path = args.file
        else:  # a fresh directory, removed when this script exits (the ranks are forked and exit with os._exit)
            own_dir = tempfile.TemporaryDirectory(prefix="init_")
            path = os.path.join(own_dir.name, "init")
        init_method = "file://" + os.path.abspath(path)

    ranks = [int(r) for r in args.ranks.split(",")] if args.ranks else list(range(args.world_size))
    stale = args.init_method == "file" and os.path.exists(path)  # a file:// path is good for one run only
    if stale and not args.reuse_stale_file:
        sys.exit(f"{init_method} exists: a run that did not clean up left it. A file:// path is good for one run:"
                 " delete it, or use a fresh path (--reuse-stale-file tries anyway)")
    ranks_running = mp.start_processes(
        run_rank, args=(ranks, args.world_size, init_method, args.timeout, args.crash_after_init),
        nprocs=len(ranks), start_method="fork", join=False)
    deadline = time.monotonic() + args.timeout  # torch's own connect retries can take twice as long
    try:
        while not ranks_running.join(timeout=0.1):
            if time.monotonic() > deadline:
                for process in ranks_running.processes:
                    process.kill()
                sys.exit(f"{init_method}: the ranks did not meet within {args.timeout:g} s"
                         + (STALE if stale else " (is every rank started, and is the address one they all reach?)"))
    except mp.ProcessExitedException as e:
        sys.exit(f"rank {ranks[e.error_index]} exited with code {e.exit_code}")
    except mp.ProcessRaisedException as e:  # the child's traceback is in str(e); its last line says why
        sys.exit(f"{init_method} failed: {str(e).strip().splitlines()[-1]}" + (STALE if stale else ""))
    finally:  # a rank that raised wrote its traceback to a file in /tmp, and torch leaves that file there
        for error_file in ranks_running.error_files:
            if os.path.exists(error_file):
                os.remove(error_file)

if __name__ == "__main__":
    main()
