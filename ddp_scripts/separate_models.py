"""A conversion that trains, and is wrong: the process group and the sampler are there, DDP is not."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = torch.nn.Linear(8, 2)  # the mistake: no DDP(model), so no gradient is ever averaged
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    print(f"rank {dist.get_rank()}: trained {len(loader)} steps an epoch")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
