"""A complete single-process training script: the starting point of the convert_to_ddp exercise (lesson 04).

    python exercises/single_process_train.py --epochs 2 --batch-size 24 --lr 0.05 --seed 0 --out model.pt

A small MLP on scikit-learn's bundled handwritten digits (8x8 pixels, read offline: 1500 of the 1797 images).
It shuffles with a DistributedSampler of one replica (num_replicas=1, rank=0): one process sees the whole data
set, in the seeded order that set_epoch() reshuffles each epoch. Under DDP with N ranks, the same sampler with
num_replicas=N gives rank r every N-th sample of that same order, so the two runs can agree exactly.
"""
import argparse
import importlib.util
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def digits(seed):
    """1500 digits as 64 features in [0, 1] and their labels, in a seeded selection."""
    # The file sklearn.datasets.load_digits() reads, read directly: importing scikit-learn takes about a second.
    sklearn_dir = importlib.util.find_spec("sklearn").submodule_search_locations[0]
    table = np.loadtxt(os.path.join(sklearn_dir, "datasets", "data", "digits.csv.gz"), delimiter=",")
    x = torch.tensor(table[:, :-1], dtype=torch.float32) / 16.0
    y = torch.tensor(table[:, -1].astype(int))
    chosen = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))[:1500]
    return TensorDataset(x[chosen], y[chosen])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=24, help="the global batch (one process)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="model.pt", help="where to save the trained model's state_dict")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    dataset = digits(args.seed)
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new order each epoch
        total, seen = 0.0, 0
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, seen = total + loss.item() * len(y), seen + len(y)
        print(f"epoch {epoch}: train loss {total / seen:.4f} on {seen} samples")
    torch.save(model.state_dict(), args.out)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
