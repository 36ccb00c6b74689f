"""A correct DDP script that, like pytorch/examples' imagenet/main.py, starts its own ranks with mp.spawn only under
--multiprocessing-distributed; under torchrun without it, it joins torchrun's ranks. Its output has lines a careless
reader of the course's `RESULT {json}` convention would choke on. --processes (fork|spawn) starts them as PyTorch's
"Writing Distributed Applications" tutorial does, with torch.multiprocessing.Process (and the start method given).
--spawn-one: each rank spawns one process that trains as that rank (correct: the doctor follows it there)."""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def train(rank, world_size):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = DDP(torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    if rank == 0:
        print("RESULT: the loss went down")  # the script's own words, not the course's convention
        print("RESULT {not json}")
        print("RESULT [1, 2]")
    dist.destroy_process_group()


def train_as_torchruns_rank(index):
    """The one process a rank spawns (--spawn-one): it trains as the rank torchrun made (torch-multip's way)."""
    train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))


if __name__ == "__main__":
    if "--multiprocessing-distributed" in sys.argv:
        mp.spawn(train, args=(2,), nprocs=2)
    elif "--spawn-one" in sys.argv:
        mp.spawn(train_as_torchruns_rank, nprocs=1)
    elif "--processes" in sys.argv:
        mp.set_start_method(sys.argv[sys.argv.index("--processes") + 1])
        processes = [mp.Process(target=train, args=(rank, 2)) for rank in range(2)]
        for p in processes:
            p.start()
        for p in processes:
            p.join()
    else:
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
