"""Samplers and evaluations the doctor must judge by what they draw, not by their class.

    torchrun --standalone --nproc-per-node=2 samplers.py [--train T] [--eval E] [--workers W] [--early-stop-on-rank0]

--train distributed (a DistributedSampler), repeat-aug (each sample on 3 ranks with each rank's own random
augmentation, as DeiT's RASampler and timm's RepeatAugSampler draw: correct), whole (no sampler: every rank the
whole data set), epochs-in-a-batch-sampler (a distributed sampler of its own, two epochs a pass, in a
batch_sampler of its own: correct), memory-shard (a data set holding this rank's own shard in memory, as a rank's file read at start
would: correct, with or without --workers), memory-same (the same in-memory data set on every rank: a mistake).
--eval padded-ordered (a padding evaluation sampler of the script's own, as timm's OrderedDistributedSampler: the
summed metric counts the padding twice), own-share (each rank evaluates its shard and rank 0 prints its own
metric: no collective combines them), reduced (the correct evaluation: exact shards, summed over the ranks),
none. --early-stop-on-rank0: rank 0 alone decides to stop after the first epoch (a mistake: rank 1 goes on).
"""
import argparse
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, TensorDataset


class RepeatAugSampler(Sampler):
    """Each index repeated `repeats` times, then dealt to the ranks; each rank keeps its 1/N share of the data set's
    length: the step count is unchanged, and each sample is augmented differently on each rank."""

    def __init__(self, dataset, num_replicas, rank, repeats=3):
        self.dataset, self.num_replicas, self.rank, self.repeats, self.epoch = dataset, num_replicas, rank, repeats, 0
        self.num_samples = len(dataset) // num_replicas

    def __iter__(self):
        order = torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(self.epoch)).tolist()
        repeated = [i for i in order for _ in range(self.repeats)]
        return iter(repeated[self.rank::self.num_replicas][:self.num_samples])

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        self.epoch = epoch


class ShardedEpochs(Sampler):
    """A distributed sampler of the script's own, as segmentation and detection trainers write them: EPOCHS epochs
    in one pass, each a new permutation of which the rank takes its strided share (correct: the ranks' shares of an
    epoch are apart, and over two epochs each rank sees most of the data)."""

    def __init__(self, dataset, num_replicas, rank, epochs=2):
        self.length, self.num_replicas, self.rank, self.epochs = len(dataset), num_replicas, rank, epochs

    def __iter__(self):
        for epoch in range(self.epochs):
            order = torch.randperm(self.length, generator=torch.Generator().manual_seed(epoch)).tolist()
            yield from order[self.rank::self.num_replicas]

    def __len__(self):
        return self.epochs * (self.length // self.num_replicas)


class GroupedBatches(Sampler):
    """A batch_sampler of the script's own around a sampler (a detection trainer's aspect-ratio grouping)."""

    def __init__(self, sampler, batch_size):
        self.sampler, self.batch_size = sampler, batch_size

    def __iter__(self):
        batch = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []

    def __len__(self):
        return len(self.sampler) // self.batch_size


class OrderedEvalSampler(Sampler):
    """In order, padded with the first indices to a multiple of the ranks, each rank a strided share."""

    def __init__(self, dataset, num_replicas, rank):
        self.length, self.num_replicas, self.rank = len(dataset), num_replicas, rank
        self.num_samples = math.ceil(self.length / num_replicas)

    def __iter__(self):
        indices = list(range(self.length))
        indices += indices[:self.num_samples * self.num_replicas - self.length]
        return iter(indices[self.rank::self.num_replicas])

    def __len__(self):
        return self.num_samples


class InMemory(Dataset):
    """Tensors loaded at start (this rank's shard file, or the whole set), read by index."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return self.x[index], self.y[index]


parser = argparse.ArgumentParser()
parser.add_argument("--train", default="distributed",
                    choices=["distributed", "repeat-aug", "whole", "memory-shard", "memory-same",
                             "epochs-in-a-batch-sampler"])
parser.add_argument("--eval", default="none", choices=["padded-ordered", "own-share", "reduced", "none"])
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--early-stop-on-rank0", action="store_true")
options = parser.parse_args()

dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
data = torch.Generator().manual_seed(0)
train_set = TensorDataset(torch.randn(96, 4, generator=data), torch.randn(96, 1, generator=data))
test_set = TensorDataset(torch.randn(25, 4, generator=data), torch.randn(25, 1, generator=data))
sampler = None
if options.train == "distributed":
    sampler = DistributedSampler(train_set, seed=0)
elif options.train == "repeat-aug":
    sampler = RepeatAugSampler(train_set, world_size, rank)
elif options.train.startswith("memory"):
    rows = slice(rank, None, world_size) if options.train == "memory-shard" else slice(None)
    train_set = InMemory(train_set.tensors[0][rows].clone(), train_set.tensors[1][rows].clone())
if options.train == "epochs-in-a-batch-sampler":
    loader = DataLoader(train_set, batch_sampler=GroupedBatches(ShardedEpochs(train_set, world_size, rank), 8),
                        num_workers=options.workers)
else:
    loader = DataLoader(train_set, batch_size=8, sampler=sampler, shuffle=sampler is None,
                        num_workers=options.workers, generator=torch.Generator().manual_seed(rank))
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
torch.manual_seed(100 + rank)  # each rank its own augmentation noise
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(3):
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    for x, y in loader:
        if options.train == "repeat-aug":
            x = x + 0.1 * torch.randn_like(x)  # the random augmentation that makes a repeat worth training
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    if options.eval != "none":
        evaluation_sampler = (OrderedEvalSampler(test_set, world_size, rank) if options.eval == "padded-ordered"
                              else DistributedSampler(test_set, shuffle=False) if options.eval == "own-share"
                              else list(range(rank, len(test_set), world_size)))
        total = torch.zeros(2)
        with torch.no_grad():
            for x, y in DataLoader(test_set, batch_size=5, sampler=evaluation_sampler):
                total += torch.tensor([F.mse_loss(model(x), y, reduction="sum").item(), len(x)])
        if options.eval != "own-share":
            dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}: test loss {total[0].item() / total[1].item():.3f} over {int(total[1])} samples")
    if options.early_stop_on_rank0 and rank == 0 and loss.item() < 10:  # decided on one rank's own loss
        break
dist.destroy_process_group()
