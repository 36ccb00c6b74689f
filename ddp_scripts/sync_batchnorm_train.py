"""Where synchronized BatchNorm may matter: a small CNN trained at 2 samples per rank, BN per rank against synced.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/sync_batchnorm_train.py --batch-per-rank 2 --seeds 0,1

For each seed, the same model, data order and steps twice: once with plain BatchNorm2d (each rank normalizes
with the statistics of its own 2 samples), once converted to the hand-made synced BN of hand_syncbn.py
(statistics of all ranks' samples). Rank 0 prints, per seed, the test accuracy and loss of both.
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
from hand_syncbn import ALL_REDUCES, convert_to_hand_sync
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


def wall_clock(device):
    if device.type == "cuda":  # GPU work is queued: wait for it, or the clock reads launch times
        torch.cuda.synchronize(device)
    return time.perf_counter()


def train_and_evaluate(bn, seed, batch, epochs, rank, world, device, train_set, test_set):
    torch.manual_seed(seed)
    model = BNNet()
    if bn == "synced":  # convert before DDP and before the optimizer: our converter makes new Parameters
        model = convert_to_hand_sync(model)
    model = DDP(model.to(device), device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=seed)
    loader = DataLoader(train_set, batch_size=batch, sampler=sampler, drop_last=True)  # never a batch of 1
    start, steps = wall_clock(device), 0
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
    seconds = wall_clock(device) - start
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
    parser.add_argument("--seeds", default="0", help="comma-separated: model init and data order, e.g. 0,1")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    backend, device = ddp_common.backend_and_device()
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    train_set, test_set = digits(0)
    result = {"world_size": world, "batch_per_rank": args.batch_per_rank, "seeds": seeds, "per_rank": [], "synced": []}
    for seed in seeds:
        for bn in ("per_rank", "synced"):
            before = dict(ALL_REDUCES)
            run = train_and_evaluate(bn, seed, args.batch_per_rank, args.epochs, rank, world, device, train_set,
                                     test_set)
            run["bn_allreduces"] = ALL_REDUCES["forward"] + ALL_REDUCES["backward"] - before["forward"] - before["backward"]
            run["bn_allreduce_seconds"] = ALL_REDUCES["seconds"] - before["seconds"]
            result[bn].append(run)
            if rank == 0:
                print(f"seed {seed}, BN {bn:>8}: last epoch's train loss {run['train_loss']:.2f} (train mode); "
                      f"test accuracy {run['test_acc']:.2f}, test loss {run['test_loss']:.2f} (eval mode)")
    if rank == 0:
        print("RESULT " + json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
