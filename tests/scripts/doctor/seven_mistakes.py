"""All seven of the doctor's mistakes in one small DDP script; with --fixed, its fixed twin (no finding).

torchrun --standalone --nproc-per-node=2 seven_mistakes.py CHECKPOINT [--fixed]
"""
import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("checkpoint")
parser.add_argument("--fixed", action="store_true")
fixed = parser.parse_args().fixed
checkpoint = parser.parse_args().checkpoint

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
sampler = DistributedSampler(data, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=4, sampler=sampler)
model = DDP(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    if fixed:
        sampler.set_epoch(epoch)  # no-set-epoch
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
dist.all_reduce(torch.ones(3))
if rank == 0 or not fixed:
    torch.save(model.module.state_dict(), checkpoint)  # save-on-every-rank
dist.barrier()  # nobody reads before rank 0 has written
if fixed:
    model.module.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))
else:
    model.module.load_state_dict(torch.load(checkpoint, weights_only=False))  # no map_location, weights_only off
if rank == 1 and not fixed:
    with torch.no_grad():
        model.module.weight.add_(0.5)  # params-diverged: a change outside DDP, on one rank
dist.all_reduce(torch.ones(2 if rank == 1 and not fixed else 3))  # collectives-differ: a shape differs
print(f"rank {rank}: done")
if fixed:
    dist.destroy_process_group()  # no-destroy
