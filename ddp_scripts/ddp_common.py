"""Shared by every lesson script: pick backend + device, and exit cleanly.

Import this module *before* calling ``dist.init_process_group`` (the scripts import it
at the top). It fixes a teardown crash that otherwise kills about 1 launch in 10 on a
2-core machine: a DDP script ends with ``destroy_process_group()`` and still dies with
SIGABRT, "terminate called without an active exception". What happens (torch 2.13/2.14,
found with a core dump; see notebooks/00_start_here.ipynb):

1. gloo runs collectives on worker threads. A worker frees each finished piece of work
   *after* the caller has been woken, and freeing DDP's gradient all-reduce releases a
   Python object, so the worker must take the GIL.
2. Those threads only stop when the process group is destroyed. ``destroy_process_group()``
   drops torch's own reference, but the group survives if anything else holds it:
   a. ``torch.distributed.nn.functional`` has defaults ``group=group.WORLD``, evaluated
      when it is imported. DDP imports it (via ``torch._dynamo``). Imported *after*
      ``init_process_group``, those defaults hold the live group forever.
   b. A DDP module sits in a reference cycle, so it (and the group it holds) is freed
      only by the garbage collector: at the latest, while the interpreter shuts down.
   c. FSDP2 (lesson 12): a DeviceMesh keeps its groups in ``mesh._pg_registry``, and DTensor's
      caches (sharding propagation, redistribute plans) keep the mesh for good.
3. If the interpreter is already shutting down when a gloo worker asks for the GIL,
   Python ends that thread inside a C++ destructor that may not throw: std::terminate.

So: (a) import ``torch.distributed.nn`` now, while ``group.WORLD`` is still None, and
(b) collect garbage at exit while the interpreter is still whole: the DDP module goes,
the group goes, and its threads are joined before Python starts to shut down;
(c) at exit, a mesh that outlives the collection lets go of its groups too.
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
