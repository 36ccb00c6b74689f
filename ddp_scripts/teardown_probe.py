"""Is the process group really gone (gloo's worker threads joined) before Python exits?

    torchrun --standalone --nproc-per-node=2 ddp_scripts/teardown_probe.py [--without-fix]

--without-fix skips `import ddp_common` (see that file): the group then outlives
destroy_process_group(), and its threads run into the interpreter's shutdown.
"""
import gc
import json
import os
import sys

import torch

if "--without-fix" not in sys.argv:
    import ddp_common  # noqa: F401  before init_process_group, as in every lesson script
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def gloo_threads_alive() -> int:
    """Threads named by gloo (Linux names every thread in /proc/self/task/*/comm)."""
    names = [open(f"/proc/self/task/{t}/comm").read() for t in os.listdir("/proc/self/task")]
    return sum(name.startswith(("pt_gloo", "gloo")) for name in names)


def main():
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(4, 4))
    model(torch.randn(2, 4)).sum().backward()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    gc.collect()  # what ddp_common's atexit hook does; done here so we can look afterwards
    if os.environ["RANK"] == "0":
        print(f"gloo threads still alive after main() returned: {gloo_threads_alive()}")
        print("RESULT " + json.dumps({"fix": "--without-fix" not in sys.argv,
                                      "gloo_threads_alive": gloo_threads_alive()}))
