"""Written on one machine, wrong on two: the data shard and the writer are picked by LOCAL_RANK, not RANK."""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    checkpoint = sys.argv[1]
    dist.init_process_group("gloo")
    local_rank = int(os.environ["LOCAL_RANK"])  # right for picking this node's GPU...
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    sampler = DistributedSampler(data, rank=local_rank)  # ...wrong for the shard: the global rank picks it
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = DDP(torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    if local_rank == 0:  # wrong: one writer per node, every node writing the same path
        torch.save(model.module.state_dict(), checkpoint)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
