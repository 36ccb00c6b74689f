"""Correct code of kinds practitioners write, on which a careless doctor cries wolf; the doctor must find nothing.

- ZeroRedundancyOptimizer beside DDP (its inner optimizer holds each rank's own shard);
- data pre-sharded per rank, as files per rank would be, read by DataLoader workers: of one length, and of unequal
  lengths under Join([model, optimizer]) (the fix for uneven inputs); and a rank's shard held in memory, read by a
  worker (the same indices on every rank, of other tensors);
- two tasks' loaders made by one helper, each sampler with its set_epoch;
- an all_to_all_single with uneven splits (mixture-of-experts routing): the ranks' tensors differ in shape;
- a file per rank, each saved by its rank and read back there;
- dropout with each rank's own seed, set after the model is made (the fix the doctor gives);
- an epoch stopped by counting its batches (Lightning's limit_train_batches, a break): the same count on every rank.

    torchrun --standalone --nproc-per-node=2 correct_patterns.py SCRATCH_DIR
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset


class RankShard(Dataset):
    """This rank's own pre-made shard (a file per rank): samples no other rank reads."""

    def __init__(self, path, length):
        self.path, self.length = path, length

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(1000 * sum(self.path.encode()) + index)
        return torch.randn(4, generator=generator), torch.randn(1, generator=generator)


class InMemoryShard(Dataset):
    """This rank's rows of a data set, loaded into memory at start (a shard file read whole): tensors, no path."""

    def __init__(self, rank, world_size):
        generator = torch.Generator().manual_seed(5)
        x, y = torch.randn(48, 4, generator=generator), torch.randn(48, 1, generator=generator)
        self.x, self.y = x[rank::world_size].clone(), y[rank::world_size].clone()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return self.x[index], self.y[index]


def task_loader(seed, length):
    """One helper makes every task's loader: the samplers share a line, not a data set."""
    generator = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(length, 4, generator=generator), torch.randn(length, 1, generator=generator))
    sampler = DistributedSampler(data, seed=0)
    return sampler, DataLoader(data, batch_size=4, sampler=sampler)


def step(model, optimizer, x, y):
    optimizer.zero_grad()
    F.mse_loss(model(x), y).backward()
    optimizer.step()


def main():
    scratch = sys.argv[1]
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Dropout(0.1),
                                    torch.nn.Linear(8, 1)))
    torch.manual_seed(1 + rank)  # dropout: each rank its own masks
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.05)

    shard = DataLoader(RankShard(f"shard-{rank}.bin", 24), batch_size=4, num_workers=1)  # the same indices on
    for x, y in shard:  # every rank, of other files
        step(model, optimizer, x, y)
    loaded = InMemoryShard(rank, world_size)  # this rank's shard, read into memory at start, then by a worker
    for x, y in DataLoader(loaded, batch_size=4, shuffle=True, num_workers=1):
        step(model, optimizer, x, y)
    uneven = DataLoader(RankShard(f"extra-{rank}.bin", 24 + 4 * rank), batch_size=4, num_workers=1)
    with Join([model, optimizer]):  # rank 1 has a batch more than rank 0
        for x, y in uneven:
            step(model, optimizer, x, y)

    tasks = [task_loader(seed, 32 + 8 * seed) for seed in (1, 2)]
    for epoch in range(2):
        for sampler, loader in tasks:
            sampler.set_epoch(epoch)
            for batch, (x, y) in enumerate(loader):
                if epoch == 1 and batch == 2:  # the second epoch stops by counting: no StopIteration
                    break
                step(model, optimizer, x, y)

    routed = [d + 1 for d in range(world_size)]  # every rank routes d + 1 rows to rank d: rank d receives more
    send = torch.full((sum(routed), 2), float(rank))
    received = torch.empty((rank + 1) * world_size, 2)
    dist.all_to_all_single(received, send, output_split_sizes=[rank + 1] * world_size, input_split_sizes=routed)

    own = os.path.join(scratch, f"state-rank{rank}.pt")  # each rank's own file, read back by the rank that wrote it
    torch.save(model.module.state_dict(), own)
    model.module.load_state_dict(torch.load(own, weights_only=True))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
