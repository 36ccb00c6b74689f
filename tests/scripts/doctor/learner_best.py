"""A learner's own script, converted with the template: a small CNN on 8x8 digits, an evaluation each epoch and
"save the best". The doctor must follow the samples each rank evaluated, whatever made its share.

    torchrun --standalone --nproc-per-node=2 learner_best.py [--eval E] [--barrier after|in-branch|none]
             [--log-loss] [--epochs N] [--save PATH]

--eval subset (each rank its Subset(val_set, range(rank, len, world)), the course's unpadded shards, no all-reduce:
each rank decides "best" from its own half), sampler (a DistributedSampler, no all-reduce), reduced (the Subsets,
the correct and wrong counts all-reduced: one accuracy on every rank). --barrier after: a dist.barrier() after the
save, as lesson 07 teaches (it carries no data); in-branch: the barrier inside `if val_acc > best_acc:` (a hang when
one rank improves and another does not). --log-loss all-reduces each training step's loss for the log (a collective
after the evaluation that has nothing to do with it).
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--eval", default="subset", choices=["subset", "sampler", "reduced"])
parser.add_argument("--barrier", default="none", choices=["none", "after", "in-branch"])
parser.add_argument("--log-loss", action="store_true")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--save", default=os.devnull)
options = parser.parse_args()

dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()

# Digits the learner would read from a file: 8x8 images, the label drawn from a fixed rule, noisy.
data = torch.Generator().manual_seed(0)
images = torch.rand(400, 1, 8, 8, generator=data)
labels = (images.flatten(1) @ torch.randn(64, 10, generator=data)).argmax(1)  # a rule the model can learn
images += 0.5 * torch.randn(images.shape, generator=data)
train_set, val_set = TensorDataset(images[:300], labels[:300]), TensorDataset(images[300:], labels[300:])

train_sampler = DistributedSampler(train_set, seed=0)
train_loader = DataLoader(train_set, batch_size=16, sampler=train_sampler)
if options.eval == "sampler":
    val_loader = DataLoader(val_set, batch_size=20, sampler=DistributedSampler(val_set, shuffle=False))
else:
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)), batch_size=20)

torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 64, 10)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
best_acc = -1.0
for epoch in range(options.epochs):
    train_sampler.set_epoch(epoch)
    model.train()
    for x, y in train_loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if options.log_loss:
            logged = loss.detach().clone()
            dist.all_reduce(logged)
    model.eval()
    counts = torch.zeros(2)
    with torch.no_grad():
        for x, y in val_loader:
            counts += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)])
    if options.eval == "reduced":
        dist.all_reduce(counts)
    val_acc = (counts[0] / counts[1]).item()
    print(f"rank {rank} epoch {epoch}: val_acc {val_acc:.3f}")
    if val_acc > best_acc:
        best_acc = val_acc
        if rank == 0:
            torch.save(model.module.state_dict(), options.save)
        if options.barrier == "in-branch":
            dist.barrier()  # nobody moves on before the checkpoint is whole
    if options.barrier == "after":
        dist.barrier()
dist.destroy_process_group()
