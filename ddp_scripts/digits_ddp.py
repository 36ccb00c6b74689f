"""The same script on N processes: five changes, each marked "DDP n/5".

    torchrun --standalone --nproc-per-node=2 ddp_scripts/digits_ddp.py --batch-size 64 --save ddp.pt
"""
import argparse
import importlib.util
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddp_common import backend_and_device  # nccl + cuda:LOCAL_RANK, or gloo + CPU


def digits():
    """1792 (= 28 x 64) of the 8x8 handwritten digits in the file scikit-learn ships: offline, no import."""
    sklearn_dir = importlib.util.find_spec("sklearn").submodule_search_locations[0]
    table = np.loadtxt(os.path.join(sklearn_dir, "datasets", "data", "digits.csv.gz"), delimiter=",")[:1792]
    return TensorDataset(torch.tensor(table[:, :-1], dtype=torch.float32) / 16, torch.tensor(table[:, -1]).long())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=64, help="the global batch, over all ranks")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save", default="model.pt")
    args = parser.parse_args()

    backend, device = backend_and_device()  # DDP 1/5: this rank's device (cuda:LOCAL_RANK, or the CPU)
    dist.init_process_group(backend)  # DDP 2/5: join the others (torchrun says where they meet)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)).to(device)
    # DDP 3/5: wrap. It copies rank 0's weights to every rank, and averages gradients in backward().
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = digits()
    sampler = DistributedSampler(data)  # DDP 4/5: each rank its own share of every batch
    loader = DataLoader(data, batch_size=args.batch_size // world_size, sampler=sampler)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # DDP 4/5: a new order each epoch, the same on all ranks
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:  # DDP 5/5: one rank prints and saves
            print(f"epoch {epoch}: last batch loss {loss.item():.4f} (rank 0's share of the batch)")

    if rank == 0:
        torch.save(model.module.state_dict(), args.save)  # .module: the model inside the wrapper
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
