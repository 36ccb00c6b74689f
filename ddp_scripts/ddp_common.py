"""Shared by every lesson script: pick backend + device, and exit cleanly. Import it *before* init_process_group:
without (a), (b), (c) below about 1 gloo launch in 10 died at exit (SIGABRT): notebooks/99_appendix_under_the_hood.
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
    """nccl and the rank's own GPU (cuda:LOCAL_RANK, or the one a launcher shows it), else gloo and the CPU.
    DDP_BACKEND=nccl|gloo chooses for every node alike (GPU_DAY_ONE.md)."""
    local_rank, ranks_here = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    own_gpu = local_rank if gpus >= ranks_here else 0 if gpus == 1 and visible and "," not in visible else None
    backend = os.environ.get("DDP_BACKEND") or ("nccl" if own_gpu is not None else "gloo")
    if backend == "nccl" and own_gpu is not None:
        torch.cuda.set_device(own_gpu)  # before anything touches CUDA, or every rank starts on GPU 0
        return "nccl", torch.device("cuda", own_gpu)
    if backend != "gloo":
        sys.exit(f"DDP_BACKEND={backend}, {gpus} GPU(s) for {ranks_here} ranks here: nccl needs one a rank, gloo none")
    if gpus and "DDP_BACKEND" not in os.environ:  # GPUs, but not one per rank: say so, never silently
        print(f"{gpus} GPU(s) for {ranks_here} ranks on this machine: using gloo on the CPU", file=sys.stderr)
    return "gloo", torch.device("cpu")
