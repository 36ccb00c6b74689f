"""Is the process group really gone (gloo's worker threads joined) before Python exits?

    torchrun --standalone --nproc-per-node=2 ddp_scripts/teardown_probe.py [--without-fix | --without-fix-on-rank R]

--without-fix skips `import ddp_common` (see that file) on every rank, --without-fix-on-rank R on rank R only:
the group then outlives destroy_process_group() in that process, and its threads run into the interpreter's
shutdown. Threads belong to a process, so each rank counts its own and prints its own RESULT line. The probe
looks from an atexit hook registered *before* ddp_common's: atexit runs hooks last-in, first-out, so it looks
after ddp_common's own hook has run, as Python's shutdown would.
"""
import atexit
import json
import os
import sys

import torch

RANK = os.environ["RANK"]
WITHOUT_FIX = "--without-fix" in sys.argv or (
    "--without-fix-on-rank" in sys.argv and sys.argv[sys.argv.index("--without-fix-on-rank") + 1] == RANK)


def gloo_threads_alive() -> int | None:
    """Threads named by gloo: Linux names every thread in /proc/self/task/*/comm. None without /proc (macOS)."""
    if not os.path.isdir("/proc/self/task"):
        return None
    names = [open(f"/proc/self/task/{t}/comm").read() for t in os.listdir("/proc/self/task")]
    return sum(name.startswith(("pt_gloo", "gloo")) for name in names)


def report():
    alive = gloo_threads_alive()
    if alive is None:
        print("no /proc on this system (Linux only): cannot count gloo threads; probe skipped")
    else:
        print(f"rank {RANK}, {'without' if WITHOUT_FIX else 'with'} the fix: gloo threads still alive at exit: {alive}")
    # Every rank, not only rank 0: each reports its own process.
    print("RESULT " + json.dumps({"fix": not WITHOUT_FIX, "gloo_threads_alive": alive}), flush=True)
    leave_when_every_rank_has_reported()


def leave_when_every_rank_has_reported(seconds=30):
    """A rank without the fix may abort right after its report, and torchrun then stops the others at once, maybe
    before they print theirs (lesson 11, section 5): each rank marks itself on torchrun's store and waits for all."""
    import datetime
    import torch.distributed as dist
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=seconds))
    store.set(f"teardown_probe/reported/{RANK}", "yes")
    try:
        store.wait([f"teardown_probe/reported/{rank}" for rank in range(int(os.environ["WORLD_SIZE"]))])
    except dist.DistStoreError:
        print(f"rank {RANK}: not every rank reported within {seconds} s")


atexit.register(report)  # first registered, last to run
if not WITHOUT_FIX:
    import ddp_common  # noqa: F401  before init_process_group, as in every lesson script; registers gc.collect at exit
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def main():
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(4, 4))
    model(torch.randn(2, 4)).sum().backward()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()  # then Python exits: ddp_common's hook (with the fix), then report()
