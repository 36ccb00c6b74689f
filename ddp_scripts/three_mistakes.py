"""A learner's first DDP script: it runs, it trains, and it has three of the classic mistakes."""
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    checkpoint = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = DDP(torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        torch.save(model.module.state_dict(), checkpoint)
    dist.barrier()
    model.module.load_state_dict(torch.load(checkpoint, weights_only=False))  # the last checkpoint, to evaluate
    print(f"rank {rank}: trained 3 epochs of {len(loader)} steps")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
