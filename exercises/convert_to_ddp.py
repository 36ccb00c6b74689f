"""Exercise (lesson 04): convert a single-process training script to DDP.

This file starts as a copy of exercises/single_process_train.py. Make it run under torchrun:

    torchrun --standalone --nproc-per-node=2 exercises/convert_to_ddp.py --batch-size 24 --out model.pt

with --batch-size meaning the GLOBAL batch (over all ranks), and rank 0 alone writing --out: a state_dict
whose keys have no "module." prefix. The check runs it at 2 and 3 ranks with the same flags as one
single-process run, and the final parameters must equal that run's.

The TODOs mark where DDP changes something. Check it:   python -m lessons check convert_to_ddp
"""
import argparse
import importlib.util
import os

import numpy as np
import torch
import torch.distributed as dist  # noqa: F401  (you will need these two)
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: F401
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
    parser.add_argument("--batch-size", type=int, default=24, help="the global batch, over all ranks")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="model.pt", help="where to save the trained model's state_dict")
    args = parser.parse_args()

    # TODO 1: set up the process group; know this process's rank and the world size.
    torch.manual_seed(args.seed)
    dataset = digits(args.seed)
    # TODO 2: each rank its own part of the data, and its share of the global batch.
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    # TODO 3: wrap the model in DDP. (Does the learning rate change? Does the loss?)
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
    # TODO 4: rank 0 alone saves, without the "module." prefix; then shut the process group down.
    torch.save(model.state_dict(), args.out)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
