"""Evaluation on unpadded shards after training: which model does each rank evaluate?

    torchrun --standalone --nproc-per-node=3 ddp_scripts/eval_fewer_samples.py --evaluate ddp|module|synced
                                                                              [--test-samples 2]

The first forward after a training step, even under no_grad, broadcasts the model's buffers (BatchNorm's running
statistics) when it goes through the DDP wrapper: a collective. With fewer test samples than ranks, the rank with
no sample never makes that forward, so the others wait for it (--evaluate ddp). model.module, the plain model
inside, runs no collective (--evaluate module), but its running statistics are each rank's own: DDP broadcast rank
0's before the training forward, then each rank updated them from its own batch. --evaluate synced broadcasts
rank 0's buffers on every rank (what DDP's next forward would do), then evaluates model.module: every rank the same
model, rank 0's, the one a checkpoint saves.
"""
import argparse
import json

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_common import backend_and_device  # import before init_process_group

parser = argparse.ArgumentParser()
parser.add_argument("--evaluate", choices=["ddp", "module", "synced"], default="synced",
                    help="through the wrapper; the plain model as it is on each rank; rank 0's buffers first")
parser.add_argument("--test-samples", type=int, default=2, help="fewer than the ranks: a rank evaluates nothing")
args = parser.parse_args()
backend, device = backend_and_device()
dist.init_process_group(backend)
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)).to(device))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(6, 4), torch.randint(0, 2, (6,))
F.cross_entropy(model(x[rank::world_size].to(device)), y[rank::world_size].to(device)).backward()
optimizer.step()
print(f"rank {rank}: trained one step", flush=True)

# What each rank holds now: its BatchNorm's running mean and variance, gathered to compare (not part of evaluating)
buffers = torch.cat([b.flatten().float() for b in model.module.buffers() if b.is_floating_point()])
every = [torch.empty_like(buffers) for _ in range(world_size)]
dist.all_gather(every, buffers)
buffer_gap = max((b - every[0]).abs().max().item() for b in every)

test_x, test_y = torch.randn(args.test_samples, 4), torch.randint(0, 2, (args.test_samples,))
mine = list(range(rank, len(test_x), world_size))  # unpadded shards: rank r takes r, r+N, ...
evaluated = model if args.evaluate == "ddp" else model.module
if args.evaluate == "synced":
    for buffer in model.module.buffers():  # every rank, samples or not: rank 0's statistics everywhere
        dist.broadcast(buffer, src=0)
evaluated.eval()
totals = torch.zeros(2, device=device)  # summed loss, samples
with torch.no_grad():
    if mine:
        loss = F.cross_entropy(evaluated(test_x[mine].to(device)), test_y[mine].to(device), reduction="sum")
        totals += torch.stack([loss, torch.tensor(float(len(mine)), device=device)])
dist.all_reduce(totals)  # every rank, with or without samples: the sums, then one division
if rank == 0:  # one process: rank 0's model (what a checkpoint saves) on the whole test set
    one_process = F.cross_entropy(model.module(test_x.to(device)), test_y.to(device)).item()
    print("RESULT " + json.dumps({"evaluated": args.evaluate, "samples": int(totals[1].item()),
                                  "loss": (totals[0] / totals[1]).item(), "one_process_loss": one_process,
                                  "buffer_gap": buffer_gap}))
dist.destroy_process_group()
