"""Where synchronized BatchNorm matters: a small CNN trained at a few samples per rank, BN per rank against synced.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/sync_batchnorm_train.py --batch-per-rank 2

The same model, data, seed and steps twice: once with plain BatchNorm2d (each rank normalizes with the
statistics of its own 2 samples), once converted to the synchronized BN of sync_batchnorm.py (statistics
of all ranks' samples). Rank 0 prints the test accuracy and loss of both, and what synchronizing cost.
"""
import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset

import ddp_common  # import before init_process_group (see ddp_common.py)
from sync_batchnorm import ALL_REDUCES, convert_to_hand_sync
from train_ddp import digits  # lesson 04's offline data


class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(4),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def train_and_evaluate(bn, batch, epochs, rank, world, device, train_set, test_set):
    torch.manual_seed(0)
    model = BNNet()
    if bn == "synced":  # convert first, then .to(device), then DDP: DDP must see the final modules
        model = convert_to_hand_sync(model)
    model = DDP(model.to(device), device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=batch, sampler=sampler, drop_last=True)  # never a batch of 1
    start, steps = time.perf_counter(), 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        model.train()
        train_loss = torch.zeros(2, device=device)  # this epoch's loss sum and count, in training mode
        for x, y in loader:
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            train_loss += torch.stack([loss.detach() * len(y), torch.full((), float(len(y)), device=device)])
    seconds = time.perf_counter() - start
    dist.all_reduce(train_loss)
    model.module.eval()  # eval: the running statistics, no communication, on the plain model inside DDP
    totals = torch.zeros(3, device=device)  # correct, loss sum, count
    with torch.no_grad():
        for x, y in DataLoader(Subset(test_set, range(rank, len(test_set), world)), batch_size=256):
            logits = model.module(x.to(device))
            y = y.to(device)
            totals += torch.stack([(logits.argmax(1) == y).sum().float(), F.cross_entropy(logits, y, reduction="sum"),
                                   torch.full((), float(len(y)), device=device)])
    dist.all_reduce(totals)
    return {"train_loss": (train_loss[0] / train_loss[1]).item(), "test_acc": (totals[0] / totals[2]).item(),
            "test_loss": (totals[1] / totals[2]).item(), "steps": steps, "seconds": seconds}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-per-rank", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    backend, device = ddp_common.backend_and_device()
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    train_set, test_set = digits(0)
    result = {"world_size": world, "batch_per_rank": args.batch_per_rank}
    for bn in ("per_rank", "synced"):
        before = dict(ALL_REDUCES)
        result[bn] = train_and_evaluate(bn, args.batch_per_rank, args.epochs, rank, world, device, train_set, test_set)
        result[bn]["bn_allreduces"] = ALL_REDUCES["forward"] + ALL_REDUCES["backward"] - before["forward"] - before["backward"]
        result[bn]["bn_allreduce_seconds"] = ALL_REDUCES["seconds"] - before["seconds"]
        if rank == 0:
            r = result[bn]
            print(f"BN {bn:>8}: last epoch's train loss {r['train_loss']:.3f} (train mode); test accuracy "
                  f"{r['test_acc']:.3f}, test loss {r['test_loss']:.3f} (eval mode); {r['steps']} steps, "
                  f"{r['bn_allreduces']} BN all-reduces")
    if rank == 0:
        print("RESULT " + json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
