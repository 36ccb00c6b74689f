"""An elastic job: it starts with the nodes it has, and re-forms when another node joins.

    # in two terminals, the second a little later: 1 or 2 nodes, starting alone after 1 s of waiting
    torchrun --nnodes=1:2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:29500 \
        --rdzv-id=demo --rdzv-conf=last_call_timeout=1 ddp_scripts/elastic_world.py --until-world-size=4
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist

from ddp_common import backend_and_device  # import before init_process_group


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--until-world-size", type=int, default=4, help="finish once the group has this many ranks")
    parser.add_argument("--give-up-after", type=float, default=60.0, help="seconds to wait for the group to grow")
    args = parser.parse_args()

    backend, device = backend_and_device()
    dist.init_process_group(backend)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # Restarts after a failure (--max-restarts), not re-formations: a node joining leaves it at 0
    # ("membership changes do not count as retries", torch/distributed/elastic/agent/server/api.py).
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    print(f"restart {restart}: rank {rank} of {world_size} (node {os.environ['GROUP_RANK']})")

    # Steps, each a collective. A real job loads its last checkpoint first (lesson 07): a re-formed group
    # restarts every worker from the top of the script.
    steps, started = 0, time.monotonic()
    while world_size < args.until_world_size or steps < 3:
        if time.monotonic() - started > args.give_up_after:
            raise SystemExit(f"no node joined in {args.give_up_after:g} s: still {world_size} ranks")
        total = torch.ones(1, device=device)
        dist.all_reduce(total)  # every rank takes part in every step
        steps += 1
        time.sleep(0.2)  # the "training"
    if rank == 0:
        print(f"finished with {world_size} ranks after {steps} steps")
        print("RESULT " + json.dumps({"world_size": world_size, "restart_count": restart,
                                      "all_reduce_of_ones": total.item()}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
