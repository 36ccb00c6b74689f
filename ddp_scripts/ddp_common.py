"""Shared by every lesson script: pick backend + device, and exit cleanly.

Import it *before* ``dist.init_process_group``. Without it about 1 DDP launch in 10 on a 2-core
machine died at exit (SIGABRT, "terminate called without an active exception"): gloo threads of a
group that outlived ``destroy_process_group()`` ran into Python's shutdown. Fixes (a), (b), (c) below;
the whole story and its check: notebooks/99_appendix_under_the_hood.ipynb, section 5.
"""
import atexit
import gc
import os
import sys

import torch
import torch.distributed.nn  # noqa: F401  (a) must come before init_process_group


def release_process_groups():
    """Runs at exit, before the interpreter starts finalizing: free every group while it is still whole."""
    gc.collect()  # (b)
    if "torch.distributed.device_mesh" in sys.modules:  # (c) only if a mesh can exist
        from torch.distributed.device_mesh import DeviceMesh
        for mesh in [o for o in gc.get_objects() if type(o) is DeviceMesh]:  # not isinstance: it would warn
            getattr(mesh, "_pg_registry", {}).clear()


atexit.register(release_process_groups)


def backend_and_device() -> tuple[str, torch.device]:
    """nccl + cuda:LOCAL_RANK when every rank on this machine has a GPU; else gloo + CPU."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if torch.cuda.is_available() and torch.cuda.device_count() >= ranks_here:
        torch.cuda.set_device(local_rank)  # before anything touches CUDA, or every rank starts on GPU 0
        return "nccl", torch.device("cuda", local_rank)
    if torch.cuda.is_available():  # GPUs, but fewer than ranks: say so, don't fall back silently
        print(f"{torch.cuda.device_count()} GPU(s) for {ranks_here} ranks on this machine: using gloo on the CPU",
              file=sys.stderr)
    return "gloo", torch.device("cpu")
