"""Lesson 00's five changes, made by Hugging Face Accelerate: one script for one process and for torchrun.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/digits_accelerate.py --batch-size 64 --save accelerate.pt
    python ddp_scripts/digits_accelerate.py --batch-size 64 --save one.pt   # one process, the same global batch
"""
import argparse

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader

from ddp_common import backend_and_device  # the course's rule: a GPU for each rank, else the CPU
from digits_ddp import digits  # lesson 00's data: 1792 digits, offline


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=64, help="the global batch, over all processes")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save", default="model.pt")
    args = parser.parse_args()

    _, device = backend_and_device()  # fewer GPUs than ranks: Accelerate would put two ranks on one GPU
    accelerator = Accelerator(cpu=device.type == "cpu")  # 1/5 and 2/5: the device, the process group
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # In order (no shuffle): the check compares with one process, and each library seeds its shuffle its own way.
    loader = DataLoader(digits(), batch_size=args.batch_size // accelerator.num_processes)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # 3/5 wrap in DDP, 4/5 shard batches

    for epoch in range(args.epochs):
        for images, labels in loader:  # already on this process's device
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
    if accelerator.is_main_process:  # 5/5: one process saves
        torch.save(accelerator.unwrap_model(model).state_dict(), args.save)
    accelerator.end_training()  # destroys the process group


if __name__ == "__main__":
    main()
