"""A solution of exercises/convert_to_ddp.py: exercises/single_process_train.py, converted to DDP.

    torchrun --standalone --nproc-per-node=2 exercises/solutions/convert_to_ddp.py --batch-size 24 --out model.pt

--batch-size is the global batch: each of N ranks takes batch_size // N per step, so the run equals the
single-process run with the same flags (the same samples per step, the same order, the same average gradient).
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


def digits(seed):
    """1500 digits as 64 features in [0, 1] and their labels, in a seeded selection."""
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
    parser.add_argument("--out", default="model.pt", help="where rank 0 saves the trained model's state_dict")
    args = parser.parse_args()

    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before the group: else every rank's NCCL starts on GPU 0
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")  # CPU here: gloo
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if args.batch_size % world_size:
        raise SystemExit(f"--batch-size {args.batch_size} is the global batch: make it a multiple of {world_size}")

    torch.manual_seed(args.seed)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    dataset = digits(args.seed)
    # Each rank every N-th sample of the same seeded order. The loss stays a mean, and the learning rate stays:
    # it follows the global batch, which --batch-size keeps (N times the global batch: about N times the lr, 13b).
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size // world_size, sampler=sampler)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)).to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # without it every epoch repeats epoch 0's order
        totals = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(y), torch.tensor(float(len(y)), device=device)])
        dist.all_reduce(totals)
        if rank == 0:
            print(f"epoch {epoch}: train loss {(totals[0] / totals[1]).item():.4f} on {int(totals[1])} samples")
    if rank == 0:
        torch.save(model.module.state_dict(), args.out)  # .module: keys without the "module." prefix
        print(f"saved {args.out}")
    dist.barrier()  # nobody leaves before the file is written
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
