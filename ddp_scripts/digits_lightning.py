"""Lesson 00's five changes, made by Lightning: the Trainer launches nothing under torchrun, it joins it.

    torchrun --standalone --nproc-per-node=2 ddp_scripts/digits_lightning.py --batch-size 64 --save lightning.pt
    python ddp_scripts/digits_lightning.py --batch-size 64 --save one.pt   # one process, the same global batch
"""
import argparse
import os

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

from ddp_common import backend_and_device  # the course's rule: a GPU for each rank, else the CPU
from digits_ddp import digits  # lesson 00's data: 1792 digits, offline


class Digits(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))

    def training_step(self, batch, batch_index):
        images, labels = batch  # already on this process's device
        return F.cross_entropy(self.net(images), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=64, help="the global batch, over all processes")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save", default="model.pt")
    args = parser.parse_args()

    world_size = int(os.environ.get("WORLD_SIZE", 1))  # torchrun's; Lightning reads the same variables
    torch.manual_seed(0)
    model = Digits()
    _, device = backend_and_device()  # fewer GPUs than ranks: Lightning would refuse "gpu"
    trainer = L.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu",  # 1/5: the device
                        devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)), num_nodes=world_size // int(
                            os.environ.get("LOCAL_WORLD_SIZE", 1)),
                        strategy="ddp" if world_size > 1 else "auto",  # 2/5 the group, 3/5 the DDP wrapper
                        max_epochs=args.epochs, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    data = digits()
    loader = DataLoader(data, batch_size=args.batch_size // world_size)  # 4/5: the Trainer adds the sampler
    if world_size == 1:  # on N processes Lightning shuffles a training loader it shards (seed 0), even one in order:
        # one process trains on the same order only with the same sampler (and the Trainer calls its set_epoch)
        loader = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data, 1, 0, seed=0))
    trainer.fit(model, loader)
    if trainer.is_global_zero:  # 5/5: one process saves
        torch.save(model.net.state_dict(), args.save)


if __name__ == "__main__":
    main()
