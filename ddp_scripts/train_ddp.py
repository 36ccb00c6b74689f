"""One training script for plain `python` and for torchrun, unchanged (--dataset cifar10 needs the internet once).

The five DDP changes are marked 1. to 5.; the rest is lesson machinery (data, timing, RESULT).
"""
import argparse
import importlib.util
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset
from tqdm import tqdm

import ddp_common  # import before init_process_group (see ddp_common.py)


class SmallCNN(torch.nn.Module):
    """The classic CIFAR-10 tutorial network: conv-pool-conv-pool and three linear layers."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = torch.nn.Conv2d(3, 6, 5), torch.nn.Conv2d(6, 16, 5)
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(16 * 5 * 5, 120), torch.nn.Linear(120, 84), torch.nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))


def digits(seed):
    """scikit-learn's 1797 8x8 digits as 32x32 RGB (offline): 1500 to train, 297 to test."""
    # The file load_digits() reads, read directly: importing scikit-learn costs a second in every rank.
    sklearn_dir = importlib.util.find_spec("sklearn").submodule_search_locations[0]  # finds it, imports nothing
    table = np.loadtxt(os.path.join(sklearn_dir, "datasets", "data", "digits.csv.gz"), delimiter=",")
    images = torch.tensor(table[:, :-1].reshape(-1, 1, 8, 8), dtype=torch.float32) / 16.0
    images = F.interpolate(images, size=32, mode="bilinear", align_corners=False).expand(-1, 3, -1, -1)
    images = (images - 0.5) / 0.5
    labels = torch.tensor(table[:, -1].astype(int))
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    train, test = order[:1500], order[1500:]
    return TensorDataset(images[train].clone(), labels[train]), TensorDataset(images[test].clone(), labels[test])


def cifar10(args, distributed):
    import torchvision  # here, not at the top: its import costs about a second in every rank
    import torchvision.transforms as T

    transform, data_dir = T.Compose([T.ToTensor(), T.Normalize((0.5,) * 3, (0.5,) * 3)]), args.data_dir
    # One writer per file system (lesson 10b): rank 0, or each node's LOCAL_RANK 0 where its disk is its own.
    rank = int(os.environ.get("RANK", 0))
    error = None
    if int(os.environ.get("LOCAL_RANK" if args.node_local_data else "RANK", 0)) == 0:
        try:
            torchvision.datasets.CIFAR10(data_dir, train=True, download=True)
        except Exception as e:  # offline: one line, not a traceback wall
            error = f"rank {rank} could not download CIFAR-10 to {data_dir}: {type(e).__name__}: {e}"
    if distributed:
        errors = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)  # also the barrier before anyone reads
        error = "\n".join(e for e in errors if e)
    if error:
        raise SystemExit(f"{error}\n(use --dataset digits, which needs no network)")
    try:
        return (torchvision.datasets.CIFAR10(data_dir, train=True, transform=transform),
                torchvision.datasets.CIFAR10(data_dir, train=False, transform=transform))
    except RuntimeError as e:  # "Dataset not found": this node does not see the disk rank 0 wrote to
        raise SystemExit(f"rank {rank}: {e} (a node-local --data-dir? add --node-local-data)") from None


@record  # a failing rank's traceback goes into torchrun's report (lesson 00)
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["cnn", "resnet18"], default="cnn")
    parser.add_argument("--dataset", choices=["digits", "cifar10"], default="digits")
    parser.add_argument("--data-dir", default="data", help="CIFAR-10's folder (rank 0 downloads, or see below)")
    parser.add_argument("--node-local-data", action="store_true",
                        help="--data-dir is on each node's own disk: each node's LOCAL_RANK 0 downloads its copy")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank; the global batch is N times this")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-model", help="rank 0 saves the trained model's state_dict here")
    args = parser.parse_args()

    distributed = "RANK" in os.environ  # set by torchrun; plain python: one process, no process group
    if distributed:
        backend, device = ddp_common.backend_and_device()  # 1. this rank's device (nccl: set_device(local_rank))
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)  # 2.
        rank, world_size = dist.get_rank(), dist.get_world_size()
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        rank, world_size = 0, 1
    torch.manual_seed(args.seed)

    train_set, test_set = digits(args.seed) if args.dataset == "digits" else cifar10(args, distributed)
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)  # 4.
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, num_workers=args.num_workers,
                        pin_memory=device.type == "cuda")
    # Evaluation without padding (DistributedSampler would repeat samples): rank r takes r, r+N, ...
    test_loader = DataLoader(Subset(test_set, range(rank, len(test_set), world_size)), batch_size=256)

    if args.model == "cnn":
        model = SmallCNN().to(device)
    else:
        import torchvision
        model = torchvision.models.resnet18(num_classes=10).to(device)
    if distributed:  # 3. device_ids: this rank's GPU
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if rank == 0:
        print(f"{world_size} rank(s) x batch {args.batch_size} = global batch {world_size * args.batch_size}; "
              f"lr {args.lr} (with more ranks the global batch grows: scale lr with it, the 'linear scaling rule')")

    epoch_losses, timed_samples, timed_seconds = [], 0, 0.0
    for epoch in range(args.epochs):
        epoch_start = time.perf_counter()
        sampler.set_epoch(epoch)  # 4. forget it and every epoch sees the same order
        model.train()
        totals = torch.zeros(2, device=device)  # sum of losses, number of samples
        for x, y in tqdm(loader, desc=f"epoch {epoch}", disable=rank != 0, ncols=80):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            # torch.full, not torch.tensor(len(y), device=...): a blocking copy every step (lesson 06)
            totals += torch.stack([loss.detach() * len(y), torch.full((), float(len(y)), device=device)])
        if distributed:
            dist.all_reduce(totals)  # 5. sums and counts of all ranks, then rank 0 prints
        epoch_losses.append((totals[0] / totals[1]).item())
        if epoch > 0 or args.epochs == 1:  # epoch 0 warms up: not timed
            timed_samples += int(totals[1])
            timed_seconds += time.perf_counter() - epoch_start
        if rank == 0:
            print(f"epoch {epoch}: train loss {epoch_losses[-1]:.4f} (mean over all ranks' samples)")

    # Evaluate the plain model: even a no-grad forward through DDP broadcasts buffers.
    plain_model = model.module if distributed else model
    plain_model.eval()
    correct = torch.zeros(2, device=device)  # correct, seen
    with torch.no_grad():
        for x, y in test_loader:
            x, y = x.to(device), y.to(device)
            correct += torch.stack([(plain_model(x).argmax(1) == y).sum(), torch.full((), len(y), device=device)])
    if distributed:
        dist.all_reduce(correct)
    test_acc = (correct[0] / correct[1]).item()
    print(f"rank {rank}: test accuracy {test_acc:.3f} on {int(correct[1])} samples (each counted once)")
    if rank == 0 and args.save_model:
        torch.save(plain_model.state_dict(), args.save_model)
    if rank == 0:
        print("RESULT " + json.dumps({
            "world_size": world_size, "global_batch": world_size * args.batch_size, "final_loss": epoch_losses[-1],
            "test_acc": test_acc, "samples_per_s": timed_samples / timed_seconds, "epoch_losses": epoch_losses,
            "test_samples": int(correct[1])}))
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
