"""A correct DDP script but for one word: --reduction sum (the default here) sums the loss, and DDP averages the
gradients; --reduction mean is the fix."""
import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reduction", choices=["sum", "mean"], default="sum")
    reduction = parser.parse_args().reduction
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=16, sampler=sampler)  # 16 per rank
    model = DDP(torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y, reduction=reduction).backward()  # "sum": the mistake; DDP expects "mean"
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
