"""The learning rate when the global batch grows N times: the same, N times larger, or N times larger with warm-up.

    python ddp_scripts/lr_scaling.py --ranks 8 --seeds 0 1 2 3 4

One process: N ranks of B samples make the step of one process with N*B (lessons 00, 04). Four runs per seed:
  base      batch B,   learning rate lr
  same_lr   batch N*B, lr                 (a)
  scaled    batch N*B, N*lr               (b) the linear scaling rule (Goyal et al. 2017)
  warmup    batch N*B, N*lr, reached linearly over the first --warmup-epochs   (c)
"""
import argparse
import importlib.util
import json
import os

import numpy as np
import torch
import torch.nn.functional as F

from ddp_common import backend_and_device  # the device only: no process group here


def digits():
    """1792 8x8 digits, from the file scikit-learn ships."""
    sklearn_dir = importlib.util.find_spec("sklearn").submodule_search_locations[0]
    table = np.loadtxt(os.path.join(sklearn_dir, "datasets", "data", "digits.csv.gz"), delimiter=",")[:1792]
    return torch.tensor(table[:, :-1], dtype=torch.float32) / 16, torch.tensor(table[:, -1]).long()


def train(seed, batch, lr, warmup_steps, epochs, data, device):
    x, y = (t.to(device) for t in data)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    # Linear warm-up: the factor goes 1/w, 2/w, ... 1 over the first w steps, then stays at 1.
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / max(1, warmup_steps)))
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator).to(device)
        for start in range(0, len(x) - batch + 1, batch):  # whole batches only
            chunk = order[start:start + batch]
            loss = F.cross_entropy(model(x[chunk]), y[chunk])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
        with torch.no_grad():
            losses.append(F.cross_entropy(model(x), y).item())  # the loss on the whole training set
    return losses


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=8, help="N: the global batch grows N times")
    parser.add_argument("--batch", type=int, default=32, help="B: the batch of one process")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--warmup-epochs", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = parser.parse_args()
    _, device = backend_and_device()
    x, y = digits()
    data = (x[:1536], y[:1536])
    n, b = args.ranks, args.batch
    steps_per_epoch = len(data[0]) // (n * b)
    runs = {"base": (b, args.lr, 0), "same_lr": (n * b, args.lr, 0), "scaled": (n * b, n * args.lr, 0),
            "warmup": (n * b, n * args.lr, args.warmup_epochs * steps_per_epoch)}
    curves = {name: [train(seed, *config, args.epochs, data, device) for seed in args.seeds]
              for name, config in runs.items()}
    print("RESULT " + json.dumps({"ranks": n, "batch": b, "lr": args.lr, "seeds": args.seeds,
                                  "warmup_steps": runs["warmup"][2], "steps_per_epoch_large": steps_per_epoch,
                                  "configs": {k: {"batch": v[0], "lr": v[1]} for k, v in runs.items()},
                                  "loss_per_epoch": curves}))


if __name__ == "__main__":
    main()
