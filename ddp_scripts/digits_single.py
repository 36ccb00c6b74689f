"""Your training script today: one process, one device.

    python ddp_scripts/digits_single.py --batch-size 64 --save single.pt
"""
import argparse
import importlib.util
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, RandomSampler, TensorDataset


def digits():
    """1792 (= 28 x 64) of the 8x8 handwritten digits in the file scikit-learn ships: offline, no import."""
    sklearn_dir = importlib.util.find_spec("sklearn").submodule_search_locations[0]
    table = np.loadtxt(os.path.join(sklearn_dir, "datasets", "data", "digits.csv.gz"), delimiter=",")[:1792]
    return TensorDataset(torch.tensor(table[:, :-1], dtype=torch.float32) / 16, torch.tensor(table[:, -1]).long())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=64, help="the global batch (one process)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save", default="model.pt")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = digits()
    order = torch.Generator()  # a new order each epoch, the same every run
    loader = DataLoader(data, batch_size=args.batch_size, sampler=RandomSampler(data, generator=order))

    for epoch in range(args.epochs):
        order.manual_seed(epoch)  # the order DistributedSampler picks (seed 0 + epoch): the runs compare
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: last batch loss {loss.item():.4f}")

    torch.save(model.state_dict(), args.save)


if __name__ == "__main__":
    main()
