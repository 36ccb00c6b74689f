"""DDP against FSDP2 (fully_shard) on the same model and data: the same training, and what each rank holds.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/fsdp_vs_ddp.py

The same MLP trains a few AdamW steps from the same start: wrapped in DDP (every rank holds all the
parameters, gradients and optimizer states), and with fully_shard on each layer, then on the whole model
(every rank holds a 1/N shard of each, and gathers a layer's full parameters just before it runs).
Two more FSDP2 runs change one thing each: MixedPrecisionPolicy (bf16 compute, fp32 reduction), and
reshard_after_forward=False (keep the gathered parameters from forward to backward).
"""
import argparse
import json
import sys
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_common  # import before init_process_group (see ddp_common.py)

EVENTS = []  # what happened on this rank, in order: layers' forward/backward, FSDP2's collectives
TRAFFIC = []  # (collective, bytes of its full-size tensor) for the same collectives
VARIANTS = {  # fully_shard's keyword arguments
    "fully_shard": {},
    "MixedPrecisionPolicy(bf16, fp32)": {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                           reduce_dtype=torch.float32)},
    "reshard_after_forward=False": {"reshard_after_forward": False},
}

# FSDP2 warns that the root's output is a view, which an in-place op would break; we do none.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")


def counted(name, collective, full_size_tensor):
    def wrapper(*args, **kwargs):
        EVENTS.append(name)
        t = full_size_tensor(args, kwargs)
        TRAFFIC.append((name, t.numel() * t.element_size()))
        return collective(*args, **kwargs)
    return wrapper


# FSDP2 calls these two through the torch.distributed module: wrapping them counts every call.
dist.all_gather_single = counted("all-gather", dist.all_gather_single,  # the gathered output
                                 lambda args, kwargs: args[0] if args else kwargs["output_tensor"])
dist.reduce_scatter_single = counted("reduce-scatter", dist.reduce_scatter_single,  # the full-size input
                                     lambda args, kwargs: args[1] if len(args) > 1 else kwargs["input"])


def make_model(widths):
    torch.manual_seed(0)  # the same start for DDP and FSDP2, on every rank
    layers = []
    for i, (n_in, n_out) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def log_layers(model):
    """Record each Linear's forward and backward in EVENTS, next to the collectives."""
    for i, layer in enumerate(m for m in model.modules() if isinstance(m, nn.Linear)):
        layer.register_forward_pre_hook(lambda *_, i=i: EVENTS.append(f"forward {i}"))
        layer.register_full_backward_pre_hook(lambda *_, i=i: EVENTS.append(f"backward {i}"))


def local_bytes(t):
    t = t.to_local() if isinstance(t, DTensor) else t  # a DTensor's shard: what this rank really holds
    return t.numel() * t.element_size()


def bytes_held(model, optimizer):
    return {"param_bytes": sum(local_bytes(p) for p in model.parameters()),
            "grad_bytes": sum(local_bytes(p.grad) for p in model.parameters() if p.grad is not None),
            "optimizer_bytes": sum(local_bytes(v) for s in optimizer.state.values() for v in s.values()
                                   if torch.is_tensor(v))}


def train(model, x, y, steps):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)  # after fully_shard: on the sharded parameters
    for step in range(steps):
        if step == steps - 1:
            EVENTS.clear()  # keep the last step's events: a steady step
            TRAFFIC.clear()
        optimizer.zero_grad()
        out = model(x)
        nn.functional.mse_loss(out.float(), y).backward()
        optimizer.step()
    return optimizer, str(out.dtype).removeprefix("torch.")


def fsdp2(widths, device, world, kwargs):
    model = make_model(widths).to(device)
    mesh = init_device_mesh(device.type, (world,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, **kwargs)  # each layer its own unit: gathered just before it runs
    fully_shard(model, mesh=mesh, **kwargs)  # the root: whatever is left, and the hooks that drive the rest
    log_layers(model)
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--widths", default="12,50,50,5", help="layer widths: 12,50,50,5 is 3 Linear layers")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    backend, device = ddp_common.backend_and_device()
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world > min(widths[1:]) and rank == 0:  # FSDP2 shards dim 0, the rows; fewer rows than ranks: empty shards
        print(f"note: a layer has {min(widths[1:])} rows for {world} ranks; FSDP2 pads it, so some ranks hold an "
              "empty shard of it (and still take part in its collectives); this script goes on", file=sys.stderr)

    g = torch.Generator().manual_seed(1)  # the global batch; each rank trains on its slice, as under DDP
    x_all, y_all = torch.randn(8 * world, widths[0], generator=g), torch.randn(8 * world, widths[-1], generator=g)
    x, y = x_all[8 * rank: 8 * (rank + 1)].to(device), y_all[8 * rank: 8 * (rank + 1)].to(device)

    ddp = DDP(make_model(widths).to(device), device_ids=[device.index] if device.type == "cuda" else None)
    ddp_optimizer, _ = train(ddp, x, y, args.steps)
    ddp_bytes = bytes_held(ddp.module, ddp_optimizer)
    ddp_params = [p.detach().cpu() for p in ddp.module.parameters()]

    variants = {}
    for name, kwargs in VARIANTS.items():
        model = fsdp2(widths, device, world, kwargs)
        optimizer, output_dtype = train(model, x, y, args.steps)
        events, traffic = list(EVENTS), list(TRAFFIC)
        params = [p.full_tensor().cpu() for p in model.parameters()]  # gathers each shard: a collective
        variants[name] = {
            **bytes_held(model, optimizer), "output_dtype": output_dtype,
            "sharded_param_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "max_abs_diff": max((a - b).abs().max().item() for a, b in zip(ddp_params, params)),
            "allgathers_per_step": events.count("all-gather"),
            "reduce_scatters_per_step": events.count("reduce-scatter"),
            "allgather_bytes_per_step": sum(b for n, b in traffic if n == "all-gather"),
            "reduce_scatter_bytes_per_step": sum(b for n, b in traffic if n == "reduce-scatter"), "events": events}

    if rank == 0:
        fsdp = variants["fully_shard"]
        result = {"world_size": world, "widths": widths, "matches_ddp": fsdp["max_abs_diff"] < 1e-5,
                  "max_abs_diff": fsdp["max_abs_diff"], **{f"ddp_{k}": v for k, v in ddp_bytes.items()},
                  **{f"fsdp2_{k}": fsdp[k] for k in ddp_bytes}, "allgathers_per_step": fsdp["allgathers_per_step"],
                  "reduce_scatters_per_step": fsdp["reduce_scatters_per_step"], "events": fsdp["events"],
                  "variants": {n: {k: v for k, v in r.items() if k != "events"} for n, r in variants.items()}}
        for what in ("param_bytes", "grad_bytes", "optimizer_bytes"):
            print(f"{what:>15}: DDP {ddp_bytes[what]:>7,} bytes on each rank, FSDP2 {fsdp[what]:>7,} on rank 0 "
                  f"({fsdp[what] / ddp_bytes[what]:.2f} of DDP's)")
        print("RESULT " + json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
