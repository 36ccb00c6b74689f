"""Five of the doctor's mistakes in one small DDP script, the last of which crashes it; with --fixed, its fixed
twin, which also does what a careless tool takes for a mistake: none of it may raise a finding.

    torchrun --standalone --nproc-per-node=2 mistakes_then_crash.py CHECKPOINT [--fixed]
"""
import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("checkpoint")
parser.add_argument("--fixed", action="store_true")
options = parser.parse_args()
fixed = options.fixed

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
sampler = DistributedSampler(data, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=4, sampler=sampler, num_workers=1,
                    persistent_workers=True)  # one iterator for the loader's life, reset for each pass
test_loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=True, seed=1))  # no set_epoch:
model = DDP(torch.nn.Linear(4, 1))  # evaluation's order can't matter
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    if fixed:
        sampler.set_epoch(epoch)  # no-set-epoch
    first_x, _ = next(iter(loader))  # a look at one batch is no epoch
    with model.join():  # torch's own collectives (Join's all-reduces) are not the script's
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    total = torch.zeros(2)  # evaluation: each rank's summed loss and count, then summed over the ranks
    with torch.no_grad():  # evaluation passes, over the test loader and over the training loader itself
        for evaluated in (test_loader, loader):
            for x, y in evaluated:
                total += torch.tensor([torch.nn.functional.mse_loss(model(x), y, reduction="sum").item(), len(x)])
    dist.all_reduce(total)
dist.all_reduce(torch.ones(3))
if rank == 0 or not fixed:
    torch.save(model.module.state_dict(), options.checkpoint)  # save-on-every-rank
dist.barrier()  # nobody reads before rank 0 has written
if fixed:  # saved from CPU tensors: map_location changes nothing
    model.module.load_state_dict(torch.load(options.checkpoint, weights_only=True))
else:
    model.module.load_state_dict(torch.load(options.checkpoint, weights_only=False))  # weights_only off
if rank == 1 and not fixed:
    with torch.no_grad():
        model.module.weight.add_(0.5)  # params-diverged: a change outside DDP, on one rank
dist.all_reduce(torch.ones(2 if rank == 1 and not fixed else 3))  # collectives-differ, and the crash
print(f"rank {rank}: done")
if fixed:
    dist.destroy_process_group()  # no-destroy (not reported when the script crashed)
