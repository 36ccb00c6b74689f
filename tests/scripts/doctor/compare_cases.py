"""Correct scripts that --compare must compare with the one-process run a user would call equivalent.

    torchrun --standalone --nproc-per-node=2 compare_cases.py [--batch-size B] [--loss L] [--scale-lr]
        [--bf16] [--epochs E] [--init-file PATH] [--random-sampler-alone] [--batch-sampler]
        [--save-on-every-rank PATH] [--fsdp1] [--fsdp2] [--dropout P] [--workers W]

--batch-size is per rank. --loss mean (the default); sum-over-flag sums the loss and divides by --batch-size (right
for a per-rank flag: DDP averages the ranks' gradients); sum (the mistake: N times one process's step). --scale-lr multiplies the learning rate by the world size (lessons 04, 13b).
--bf16 runs the forward under autocast to bfloat16. --init-file: rank 0 saves the first weights there, a barrier,
every rank loads them (PyTorch's DDP tutorial). --random-sampler-alone: a RandomSampler when not distributed (timm's
train.py), so one process draws other batches. --batch-sampler: the loader takes a BatchSampler over the
DistributedSampler (as Accelerate's prepared loaders do). $CHECKPOINT_DIR (an auto-resuming trainer): resume from
CHECKPOINT_DIR/last.pt when it exists, save there at the end. --save-on-every-rank: every rank saves the model to
PATH at the end (a finding of severity 2, in a run that trains the same model). --fsdp1: FullyShardedDataParallel
instead of DDP (each rank's optimizer holds its shard of flat parameters); --fsdp2: fully_shard (DTensor rows; the
last layer's 1-element bias leaves rank 1 of 2 an empty shard). --dropout P: a Dropout(P) layer, each rank
its own masks (the runs differ by design; --compare says to run both with --dropout 0). --workers W: the loader's
worker processes (with a batch_sampler, torch calls iter(batch_sampler) twice a pass).
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--loss", choices=["mean", "sum-over-flag", "sum"], default="mean")
parser.add_argument("--scale-lr", action="store_true")
parser.add_argument("--bf16", action="store_true")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--init-file")
parser.add_argument("--random-sampler-alone", action="store_true")
parser.add_argument("--batch-sampler", action="store_true")
parser.add_argument("--save-on-every-rank")
parser.add_argument("--fsdp1", action="store_true")
parser.add_argument("--fsdp2", action="store_true")
parser.add_argument("--dropout", type=float, default=0.0)
parser.add_argument("--workers", type=int, default=0)
args = parser.parse_args()

distributed = "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
data = TensorDataset(torch.randn(160, 6), torch.randn(160, 1))
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Dropout(args.dropout),
                            torch.nn.Linear(16, 1))
if args.init_file:
    if rank == 0:
        torch.save(model.state_dict(), args.init_file)
    dist.barrier()
    model.load_state_dict(torch.load(args.init_file, map_location="cpu", weights_only=True))
if args.fsdp1:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    model = FSDP(model, device_id=torch.device("cpu"))
elif args.fsdp2:
    from torch.distributed.fsdp import fully_shard
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    model = fully_shard(model)
else:
    model = DDP(model)
lr = 0.05 * (world_size if args.scale_lr else 1)
optimizer = torch.optim.SGD(model.parameters(), lr=lr)
torch.manual_seed(1 + rank)  # each rank its own dropout masks
checkpoint_dir = os.environ.get("CHECKPOINT_DIR")
start_epoch = 0
if checkpoint_dir and os.path.exists(os.path.join(checkpoint_dir, "last.pt")):
    state = torch.load(os.path.join(checkpoint_dir, "last.pt"), map_location="cpu", weights_only=True)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start_epoch = state["epoch"] + 1
if args.random_sampler_alone and not distributed:
    sampler = RandomSampler(data)
else:
    sampler = DistributedSampler(data, seed=0)
if args.batch_sampler:
    loader = DataLoader(data, batch_sampler=BatchSampler(sampler, args.batch_size, drop_last=False),
                        num_workers=args.workers)
else:
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers)
for epoch in range(start_epoch, args.epochs):
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            prediction = model(x)
        if args.loss == "mean":
            loss = F.mse_loss(prediction.float(), y)
        else:
            loss = F.mse_loss(prediction.float(), y, reduction="sum") / (args.batch_size if args.loss ==
                                                                         "sum-over-flag" else 1)
        loss.backward()
        optimizer.step()
if checkpoint_dir and rank == 0:
    os.makedirs(checkpoint_dir, exist_ok=True)
    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": args.epochs - 1},
               os.path.join(checkpoint_dir, "last.pt"))
if args.save_on_every_rank:
    torch.save(model.state_dict(), args.save_on_every_rank)
dist.barrier()
dist.destroy_process_group()
