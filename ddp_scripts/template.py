"""Start here for your own script: runs unchanged as one process and under torchrun, CPU/gloo or GPU/nccl.

    python template.py --epochs 3                                    # one process
    torchrun --standalone --nproc-per-node=2 template.py --epochs 3  # one process per device
    ... --checkpoint ckpt.pt                                         # save each epoch; run again to resume

Swap in your data (data()), your model (Model) and your loss; keep the rest. Copy it: it imports nothing of ours.
"""
import argparse
import atexit
import contextlib
import datetime
import gc
import importlib.util
import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  before init_process_group: avoids a rare abort at exit (lesson 99)
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

atexit.register(gc.collect)  # with the import above: the DDP model's cycle and its group go before Python does


def backend_and_device():
    """nccl and the rank's own GPU (cuda:LOCAL_RANK, or the one a launcher shows it), else gloo and the CPU.
    DDP_BACKEND=nccl|gloo chooses for every node alike (GPU_DAY_ONE.md)."""
    local_rank, ranks_here = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    own_gpu = local_rank if gpus >= ranks_here else 0 if gpus == 1 and visible and "," not in visible else None
    backend = os.environ.get("DDP_BACKEND") or ("nccl" if own_gpu is not None else "gloo")
    if backend == "nccl" and own_gpu is not None:
        torch.cuda.set_device(own_gpu)  # before anything touches CUDA, or every rank lands on GPU 0 (lesson 04)
        return "nccl", torch.device("cuda", own_gpu)
    if backend != "gloo":
        sys.exit(f"DDP_BACKEND={backend}, {gpus} GPU(s) for {ranks_here} ranks here: nccl needs one a rank, gloo none")
    if gpus and "DDP_BACKEND" not in os.environ:  # GPUs, but not one per rank: say so, never silently
        print(f"{gpus} GPU(s) for {ranks_here} ranks on this machine: using gloo on the CPU", file=sys.stderr)
    return "gloo", torch.device("cpu")


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))

    def forward(self, x):
        return self.layers(x)


def data(seed):
    """scikit-learn's 1797 handwritten 8x8 digits, read from its own file (no download): 1500 train, 297 test."""
    sklearn_dir = importlib.util.find_spec("sklearn").submodule_search_locations[0]
    table = np.loadtxt(os.path.join(sklearn_dir, "datasets", "data", "digits.csv.gz"), delimiter=",")
    images, labels = torch.tensor(table[:, :-1], dtype=torch.float32) / 16.0, torch.tensor(table[:, -1].astype(int))
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    train, test = order[:1500], order[1500:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[test], labels[test])


@record  # a failing rank's traceback goes into torchrun's error report, not only its own log (lesson 00)
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank and per step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", help="save here after each epoch; resume from it if it exists")
    parser.add_argument("--stop-after", type=int, help="epochs in this job (a job's time limit); then resume")
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--sync-bn", action="store_true", help="BatchNorm statistics over all ranks (GPU only)")
    parser.add_argument("--amp", action="store_true", help="autocast: bf16 where supported, else fp16 with a scaler")
    parser.add_argument("--compile", nargs="?", const="inductor", help="torch.compile (a backend may follow)")
    parser.add_argument("--clip", type=float, help="clip the gradient's norm to this, after the all-reduce")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader processes per rank (lesson 06)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a collective may wait for a rank")
    args = parser.parse_args()

    # Under torchrun RANK is set: one process per device. With plain python: one process, no group (lesson 04).
    distributed = "RANK" in os.environ
    backend, device = backend_and_device()
    if distributed:  # device_id: nccl connects now; timeout: a rank that never comes fails, not hangs (lesson 11)
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout),
                                device_id=device if device.type == "cuda" else None)
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.manual_seed(args.seed)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)

    train_set, test_set = data(args.seed)
    # Each rank a different 1/N of the data, reshuffled every epoch by set_epoch (lesson 05).
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, pin_memory=device.type == "cuda",
                        num_workers=args.workers, persistent_workers=args.workers > 0)
    # Evaluation without padding: rank r takes samples r, r+N, ..., so each is counted once (lesson 05).
    test_loader = DataLoader(Subset(test_set, range(rank, len(test_set), world_size)), batch_size=256)

    model = Model().to(device)
    torch.manual_seed(args.seed + rank)  # the same weights; from here each rank its own dropout, augmentation (07b)
    if args.sync_bn:  # only BatchNorm layers change; nccl only (lesson 08)
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    plain = model  # what we save and evaluate: the unwrapped model (lesson 07)
    if args.compile:  # compile, then wrap: a graph per bucket, for any model (an nn.Sequential too; lesson 13b)
        model = torch.compile(model, backend=args.compile)
    if distributed:
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(plain.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    amp_dtype = torch.float16 if device.type == "cuda" and not torch.cuda.is_bf16_supported() else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp and amp_dtype == torch.float16)  # fp16 needs it

    start_epoch = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        # map_location: onto this rank's device, not the one it was saved from; weights_only: no code runs (lesson 07)
        state = torch.load(args.checkpoint, map_location=device, weights_only=True)
        for part, obj in [("model", plain), ("optimizer", optimizer), ("scheduler", scheduler), ("scaler", scaler)]:
            if state[part]:  # a scaler saved without --amp holds nothing, and an enabled one refuses {}
                obj.load_state_dict(state[part])
        start_epoch = state["epoch"]  # the sampler's position: the epoch to run next
        if rank == 0:
            print(f"resumed from {args.checkpoint} at epoch {start_epoch}")

    epoch_losses = []
    end_epoch = min(args.epochs, start_epoch + args.stop_after) if args.stop_after else args.epochs
    for epoch in range(start_epoch, end_epoch):  # the schedule spans --epochs, whatever the job's share
        sampler.set_epoch(epoch)  # forget it and every epoch sees the same order (lesson 05)
        model.train()
        totals = torch.zeros(2, device=device)  # sum of losses, number of samples
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            last_micro_step = (step + 1) % args.accumulate == 0 or step + 1 == len(loader)
            group = min(args.accumulate, len(loader) - step // args.accumulate * args.accumulate)  # the last: shorter
            # no_sync: skip the all-reduce on micro-steps that don't step the optimizer (lesson 09)
            with model.no_sync() if distributed and not last_micro_step else contextlib.nullcontext():
                with torch.autocast(device.type, dtype=amp_dtype, enabled=args.amp):
                    loss = F.cross_entropy(model(x), y)
                scaler.scale(loss / group).backward()  # the mean over the group's micro-batches
            if last_micro_step:
                if args.clip:  # after the all-reduce: the same norm on every rank (lesson 13)
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(plain.parameters(), args.clip)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
            totals += torch.stack([loss.detach().float() * len(y), torch.full((), float(len(y)), device=device)])
        scheduler.step()
        if distributed:
            dist.all_reduce(totals)  # every rank's samples in the logged loss (lesson 04)
        epoch_losses.append((totals[0] / totals[1]).item())
        if rank == 0:  # log on rank 0 only: N copies of each line say nothing more (lesson 04)
            print(f"epoch {epoch}: train loss {epoch_losses[-1]:.4f}")
        if args.checkpoint and rank == 0:  # one writer; write then rename, so a crash never leaves half a file (07)
            state = {"model": plain.state_dict(), "optimizer": optimizer.state_dict(),
                     "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "epoch": epoch + 1}
            torch.save(state, args.checkpoint + ".tmp")
            os.replace(args.checkpoint + ".tmp", args.checkpoint)
        if args.checkpoint and distributed:
            dist.barrier()  # nobody moves on (or exits) before the checkpoint is whole

    for buffer in plain.buffers() if distributed else []:  # each rank's BatchNorm statistics: rank 0's to all (05)
        dist.broadcast(buffer, src=0)
    plain.eval()
    correct = torch.zeros(2, device=device)  # correct, seen
    with torch.no_grad():
        for x, y in test_loader:
            x, y = x.to(device), y.to(device)
            correct += torch.stack([(plain(x).argmax(1) == y).sum().float(), torch.full((), float(len(y)),
                                                                                        device=device)])
    if distributed:
        dist.all_reduce(correct)
    if rank == 0:
        print("RESULT " + json.dumps({
            "world_size": world_size, "epoch_losses": epoch_losses, "test_acc": (correct[0] / correct[1]).item(),
            "test_samples": int(correct[1]), "weight_sums": [p.double().sum().item() for p in plain.parameters()]}))
    if distributed:
        dist.destroy_process_group()  # a clean exit: the group's threads stop before Python does (lesson 00)


if __name__ == "__main__":
    main()
