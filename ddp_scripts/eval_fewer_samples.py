"""Evaluation on unpadded shards, with fewer test samples than ranks: one rank has none to evaluate.

    torchrun --standalone --nproc-per-node=3 ddp_scripts/eval_fewer_samples.py --evaluate ddp|module

The first forward after a training step, even under no_grad, broadcasts the model's buffers (BatchNorm's running
statistics) when it goes through the DDP wrapper: a collective. The rank with no sample never makes that forward,
so the others wait for it. --evaluate module runs model.module, the plain model inside, which runs no collective.
"""
import argparse
import json

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_common import backend_and_device  # import before init_process_group

parser = argparse.ArgumentParser()
parser.add_argument("--evaluate", choices=["ddp", "module"], default="module", help="through the wrapper, or not")
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

test_x, test_y = torch.randn(2, 4), torch.randint(0, 2, (2,))  # 2 samples, 3 ranks
mine = list(range(rank, len(test_x), world_size))  # unpadded shards: rank 2 gets none
evaluated = model if args.evaluate == "ddp" else model.module
evaluated.eval()
counts = torch.zeros(2, device=device)  # correct answers, samples
with torch.no_grad():
    if mine:
        predicted = evaluated(test_x[mine].to(device)).argmax(dim=1)
        counts += torch.tensor([(predicted == test_y[mine].to(device)).sum().item(), len(mine)], device=device)
dist.all_reduce(counts)  # every rank, with or without samples: the counts, then one division
if rank == 0:  # the accuracy is counts[0] / counts[1]; here, how many samples were evaluated, once each
    print("RESULT " + json.dumps({"evaluated": args.evaluate, "samples": int(counts[1].item())}))
dist.destroy_process_group()
