"""The `module.` prefix, both ways, with a real DDP model; and the DDP wrapped around a model left on the CPU.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/checkpoint_prefixes.py --dir /tmp/prefixes
"""
import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_common  # import before init_process_group (see ddp_common.py)
from train_ddp import SmallCNN
from checkpointing import CheckpointError, load_model_state


def same_params(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(p.cpu(), q.cpu()) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args()
    backend, device = ddp_common.backend_and_device()
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    rank = dist.get_rank()
    device_ids = [device.index] if device.type == "cuda" else None

    torch.manual_seed(0)
    ddp = DDP(SmallCNN().to(device), device_ids=device_ids)
    if rank == 0:  # one writer: the global rank 0
        args.dir.mkdir(parents=True, exist_ok=True)
        torch.save(ddp.state_dict(), args.dir / "from_wrapper.pt")  # the mistake: every key gains "module."
        torch.save(ddp.module.state_dict(), args.dir / "from_module.pt")  # the fix: the model inside
        torch.save(torch.nn.Linear(4, 2).state_dict(), args.dir / "other_model.pt")
    dist.barrier()  # the others read only once the files are complete

    def load(name):  # every rank reads onto the CPU; the model decides where the values go
        return torch.load(args.dir / name, map_location="cpu", weights_only=True)

    wrapped = load("from_wrapper.pt")
    plain = SmallCNN()
    try:  # 1. a wrapper's checkpoint into a plain model, strictly: torch refuses
        plain.load_state_dict(wrapped)
        strict_error = None
    except RuntimeError as e:
        strict_error = " ".join(str(e).split())[:150] + " ..."
    load_model_state(plain, wrapped, "from_wrapper.pt")  # 2. the fix: drop the prefix, then load
    into_plain = same_params(plain, ddp.module)

    fresh = SmallCNN()  # 3. a plain checkpoint into a plain model, *then* wrap it in DDP
    load_model_state(fresh, load("from_module.pt"), "from_module.pt")
    then_wrapped = DDP(fresh.to(device), device_ids=device_ids)
    into_ddp = same_params(then_wrapped.module, ddp.module)

    try:  # 4. a checkpoint of another model: one line that lists what differs
        load_model_state(SmallCNN(), load("other_model.pt"), "other_model.pt")
        mismatch = None
    except CheckpointError as e:
        mismatch = str(e)

    try:  # 5. DDP(model, device_ids=[gpu]) for a model still on the CPU: the load put it there
        DDP(SmallCNN(), device_ids=[0])
        left_on_cpu = None
    except ValueError as e:
        left_on_cpu = " ".join(str(e).split())

    if rank == 0:
        print(f"keys saved from the wrapper: {list(wrapped)[:2]} ...")
        print(f"strict load into a plain model: {strict_error}")
        print(f"after consume_prefix_in_state_dict_if_present: same weights as the DDP model: {into_plain}")
        print(f"plain checkpoint -> plain model -> DDP: same weights: {into_ddp}")
        print(f"another model's checkpoint: {mismatch}")
        print(f"DDP(model on the CPU, device_ids=[0]): ValueError: {left_on_cpu}")
        print("RESULT " + json.dumps({
            "world_size": dist.get_world_size(), "wrapper_keys_have_prefix": all(k.startswith("module.") for k in wrapped),
            "strict_load_fails": strict_error is not None, "prefix_consumed_matches": into_plain,
            "plain_then_ddp_matches": into_ddp, "mismatch_message": mismatch, "cpu_model_error": left_on_cpu}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
