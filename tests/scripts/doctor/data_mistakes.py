"""A small DDP script with the data mistakes the doctor finds, planted on request; without any, a correct script,
which also does what a careless tool takes for a mistake (a look at one batch each epoch, evaluation passes over the
test and the training loader, an evaluation sampler without set_epoch).

    torchrun --standalone --nproc-per-node=2 data_mistakes.py [--mistakes M,M] [--batch B] [--global-batch]
        [--loss-sum] [--checkpoint PATH] [--bf16]

M: no-ddp, no-sampler, one-replica, sampler-from-local-rank, unseeded-split, sampler-per-epoch, unequal-shards,
map-location-empty, save-on-local-rank-0, drop-path (a drop path, timm's kind, under one seed everywhere),
batch-norm (no mistake: a BatchNorm, whose per-rank statistics explain a --compare difference). --batch
is per rank, or the global batch with --global-batch. --steps-per-epoch K stops each epoch after K batches by
counting, as Lightning's limit_train_batches does (the pass never reaches StopIteration).
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset, random_split

MISTAKES = {"no-ddp", "no-sampler", "one-replica", "sampler-from-local-rank", "unseeded-split", "sampler-per-epoch",
            "unequal-shards", "map-location-empty", "save-on-local-rank-0", "drop-path", "batch-norm"}
parser = argparse.ArgumentParser()
parser.add_argument("--mistakes", default="")
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--global-batch", action="store_true", help="--batch is the global batch, split over the ranks")
parser.add_argument("--loss-sum", action="store_true", help="sum the loss over the batch instead of the mean")
parser.add_argument("--checkpoint", help="save here at the end (rank 0) and load it back (every rank)")
parser.add_argument("--bf16", action="store_true", help="the forward under autocast to bfloat16 (mixed precision)")
parser.add_argument("--steps-per-epoch", type=int, help="stop each epoch after this many batches")
options = parser.parse_args()
mistakes = set(filter(None, options.mistakes.split(",")))
assert mistakes <= MISTAKES, mistakes - MISTAKES

dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)  # the same data and the same first weights on every rank
data = TensorDataset(torch.randn(120, 4), torch.randn(120, 1))
if "unseeded-split" in mistakes:
    torch.manual_seed(100 + rank)  # what an unseeded random_split amounts to: each rank draws its own split
    train_set, test_set = random_split(data, [96, 24])
    torch.manual_seed(0)
else:
    train_set, test_set = random_split(data, [96, 24], generator=torch.Generator().manual_seed(0))
if "unequal-shards" in mistakes:  # each rank its own slice, cut by hand: 50 samples and 46
    train_set = Subset(train_set, range(rank * 50, min(96, rank * 50 + 50)))
per_rank_batch = options.batch // world_size if options.global_batch else options.batch


def make_loader():
    if mistakes & {"no-sampler", "unequal-shards"}:
        return None, DataLoader(train_set, batch_size=per_rank_batch, shuffle=True)
    if "one-replica" in mistakes:
        sampler = DistributedSampler(train_set, num_replicas=1, rank=0, seed=0)
    elif "sampler-from-local-rank" in mistakes:
        sampler = DistributedSampler(train_set, rank=int(os.environ["LOCAL_RANK"]), seed=0)
    else:
        sampler = DistributedSampler(train_set, seed=0)
    return sampler, DataLoader(train_set, batch_size=per_rank_batch, sampler=sampler)


test_loader = DataLoader(test_set, batch_size=8, sampler=DistributedSampler(test_set, shuffle=True, seed=1))
class DropPath(torch.nn.Module):
    """Stochastic depth as timm writes it: drops a sample's whole branch with probability drop_prob, in training."""

    def __init__(self, drop_prob):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x):
        if not self.training or self.drop_prob == 0:
            return x
        keep = (torch.rand(x.shape[0], 1) >= self.drop_prob).to(x.dtype)
        return x * keep / (1 - self.drop_prob)


model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), DropPath(0.2 if "drop-path" in mistakes else 0.0),
                            torch.nn.BatchNorm1d(8) if "batch-norm" in mistakes else torch.nn.Identity(),
                            torch.nn.Linear(8, 1))
if "no-ddp" not in mistakes:
    model = DDP(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
sampler, loader = make_loader()
for epoch in range(2):
    if "sampler-per-epoch" in mistakes:
        sampler, loader = make_loader()  # a new sampler at epoch 0, every epoch
    elif sampler is not None:
        sampler.set_epoch(epoch)
    first_x, _ = next(iter(loader))  # a look at one batch is no epoch
    for batch, (x, y) in enumerate(loader):
        if batch == options.steps_per_epoch:
            break
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=options.bf16):
            prediction = model(x)
        F.mse_loss(prediction.float(), y, reduction="sum" if options.loss_sum else "mean").backward()
        optimizer.step()
    total = torch.zeros(2)  # the evaluation's summed loss and count: each rank's share, then summed over the ranks
    with torch.no_grad():  # evaluation: no step, so no training pass, whatever the sampler's epoch
        for evaluated in (test_loader, loader):
            for x, y in evaluated:
                total += torch.tensor([F.mse_loss(model(x).float(), y, reduction="sum").item(), len(x)])
    dist.all_reduce(total)

if options.checkpoint:
    plain = model.module if isinstance(model, DDP) else model
    writer = int(os.environ["LOCAL_RANK"]) if "save-on-local-rank-0" in mistakes else rank
    if writer == 0:
        torch.save(plain.state_dict(), options.checkpoint)
    dist.barrier()  # nobody reads before rank 0 has written
    where = {} if "map-location-empty" in mistakes else "cpu"
    plain.load_state_dict(torch.load(options.checkpoint, map_location=where, weights_only=True))
print(f"rank {rank}: done")
dist.destroy_process_group()
