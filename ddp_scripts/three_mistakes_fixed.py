"""three_mistakes.py with its three mistakes fixed (each fix is marked)."""
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
        sampler.set_epoch(epoch)  # fix 1: a new order every epoch
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        if rank == 0:  # fix 2: one writer
            torch.save(model.module.state_dict(), checkpoint)
    dist.barrier()
    model.module.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))  # fix 3
    print(f"rank {rank}: trained 3 epochs of {len(loader)} steps")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
