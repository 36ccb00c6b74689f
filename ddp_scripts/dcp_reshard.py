"""Distributed checkpoints: save an FSDP2-sharded model and its optimizer from N ranks, load them on M ranks.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/dcp_reshard.py --save /tmp/dcp
    torchrun --standalone --nproc-per-node=3 ddp_scripts/dcp_reshard.py --load /tmp/dcp

Every rank writes its own shards, and the files record which slice of which tensor each piece is, so a
different number of ranks can load them. dcp.async_save writes in a background thread; .result() waits.
"""
import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import ddp_common  # import before init_process_group (see ddp_common.py)


def sharded_model(seed, widths, device, world):
    torch.manual_seed(seed)
    model = nn.Sequential(*[nn.Linear(a, b) for a, b in zip(widths, widths[1:])]).to(device)
    mesh = init_device_mesh(device.type, (world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def trained_one_step(model, widths, device):
    """An AdamW step, so that the optimizer has state to save (its two moments per parameter)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)  # after fully_shard: on the sharded parameters
    model(torch.ones(4, widths[0], device=device)).square().mean().backward()
    optimizer.step()
    return optimizer


def full_state(model, optimizer):
    """Every tensor of the model and of AdamW's state, gathered whole on this rank: the reference to compare."""
    names = {p: n for n, p in model.named_parameters()}
    state = {f"model.{k}": v.full_tensor().cpu() for k, v in model.state_dict().items()}
    for p, moments in optimizer.state.items():
        for k in ("exp_avg", "exp_avg_sq"):
            state[f"optim.{names[p]}.{k}"] = moments[k].full_tensor().cpu()
    return state


def rows_held(model):
    return {name: p.to_local().shape[0] for name, p in model.named_parameters() if name.endswith("weight")}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", type=Path)
    parser.add_argument("--load", type=Path)
    parser.add_argument("--widths", default="12,50,50,5")
    args = parser.parse_args()
    if (args.save is None) == (args.load is None):
        sys.exit("give --save DIR or --load DIR")
    widths = [int(w) for w in args.widths.split(",")]
    backend, device = ddp_common.backend_and_device()
    # async_save needs a CPU backend in the group: on GPUs, nccl for CUDA tensors and gloo for CPU ones.
    dist.init_process_group("cuda:nccl,cpu:gloo" if backend == "nccl" else backend,
                            device_id=device if device.type == "cuda" else None)
    rank, world = dist.get_rank(), dist.get_world_size()

    if args.save:
        model = sharded_model(0, widths, device, world)
        optimizer = trained_one_step(model, widths, device)
        model_state, optim_state = get_state_dict(model, optimizer)  # sharded, keyed by parameter name
        saving = dcp.async_save({"model": model_state, "optim": optim_state}, checkpoint_id=args.save)
        # ... training could go on here: the state was copied before async_save returned ...
        saving.result()  # every rank's shards are written
        full = full_state(model, optimizer)  # a reference, for the check
        if rank == 0:
            torch.save(full, args.save / "reference.pt")
            files = sorted(p.name for p in args.save.iterdir())
            print(f"saved from {world} ranks: rows of each weight on rank 0 {rows_held(model)}; files {files}")
            print("RESULT " + json.dumps({"world_size": world, "saved": True, "files": files}))
    else:
        model = sharded_model(1, widths, device, world)  # another seed: the load must overwrite every value
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model_state, optim_state = get_state_dict(model, optimizer)  # AdamW's state, created empty to load into
        state = {"model": model_state, "optim": optim_state}
        try:
            dcp.load(state, checkpoint_id=args.load)  # each rank reads the slices it now owns
        except (Exception, dcp.api.CheckpointException) as e:  # CheckpointException is a BaseException
            failures = getattr(e, "failures", None)  # rank -> (exception, its traceback) for a CheckpointException
            cause = next(iter(failures.values()))[0] if failures else e
            sys.exit(f"{args.load} is not a checkpoint of this model: {type(cause).__name__}: "
                     f"{str(cause).strip().splitlines()[0][:200]}")
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        reference = torch.load(args.load / "reference.pt", map_location="cpu", weights_only=True)
        loaded = full_state(model, optimizer)
        diff = max((loaded[k] - reference[k]).abs().max().item() for k in reference)
        if rank == 0:
            print(f"loaded on {world} ranks: rows of each weight on rank 0 {rows_held(model)}; "
                  f"max |loaded - saved| {diff:.1e}")
            print("RESULT " + json.dumps({"world_size": world, "loaded_equals_saved": diff == 0, "max_abs_diff": diff,
                                          "tensors_compared": sorted(reference), "rows_on_rank0": rows_held(model)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
