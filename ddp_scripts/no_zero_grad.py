"""A DDP loop that never calls optimizer.zero_grad(), next to the same loop that does.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/no_zero_grad.py

backward() *adds* into .grad: without zero_grad, step t applies the sum of the last t gradients. Both loops run
from the same weights on the same batches; rank 0 prints the gradient norm and the loss every 4th step.
"""
import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddp_common import backend_and_device  # import before init_process_group

EPOCHS = 3  # 16 steps each: 1024 samples, 2 ranks, 32 per rank


def train(zero_grad: bool, dataset, device) -> dict:
    torch.manual_seed(0)  # the same weights for both loops
    model = DDP(torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2)).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = DistributedSampler(dataset, seed=0)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)  # batch_size: without it, batches of 1
    norms, losses = [], []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in loader:
            if zero_grad:
                optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()  # adds this step's gradient into .grad
            norms.append(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item())
            losses.append(loss.item())
            optimizer.step()
    return {"grad_norm": norms, "loss": losses}


def main():
    backend, device = backend_and_device()
    dist.init_process_group(backend)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 20, generator=generator)
    dataset = TensorDataset(x, (x[:, 0] + x[:, 1] > 0).long())  # a task a small MLP learns in a few steps
    without, with_zero_grad = train(False, dataset, device), train(True, dataset, device)
    no_batch_size = next(iter(DataLoader(dataset, sampler=DistributedSampler(dataset))))[0]
    if dist.get_rank() == 0:
        for name, run in (("without zero_grad", without), ("with zero_grad", with_zero_grad)):
            print(f"{name:>17}, every 4th step: grad norm", " ".join(f"{n:4.1f}" for n in run["grad_norm"][3::4]))
            print(f"{'':>17}                   loss     ", " ".join(f"{v:4.2f}" for v in run["loss"][3::4]))
        print("RESULT " + json.dumps({"without_zero_grad": without, "with_zero_grad": with_zero_grad,
                                      "batch_without_batch_size": len(no_batch_size)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
