"""One small DDP training script with one slowdown (or none) planted, for benchmarks/profile_verdicts.py: the doctor's
--profile runs it, as a learner's script, and must name what was planted and nothing else.

    python -m lessons doctor benchmarks/profile_planted/planted.py -n 2 --profile -- --case straggler --sleep-ms 30
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

CASES = ("clean", "straggler", "straggler-rank0", "straggler-in-forward", "straggler-in-annotation", "loader",
         "by-hand", "late-both")


class SlowImages(Dataset):
    """Each sample costs LOAD_MS of work in the training process (decoding, say)."""

    def __init__(self, count, load_ms):
        self.count, self.load_ms = count, load_ms

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        end = time.perf_counter() + self.load_ms / 1e3
        while time.perf_counter() < end:  # busy, as decoding is
            pass
        g = torch.Generator().manual_seed(index)
        return torch.randn(256, generator=g), torch.randn(1, generator=g)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=CASES, default="clean")
    parser.add_argument("--sleep-ms", type=float, default=30.0, help="the straggler's extra time a step")
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    # a BatchNorm's buffers are broadcast by DDP at every forward: there the others wait for a late rank
    norm = [torch.nn.BatchNorm1d(args.width)] if args.case == "straggler-in-forward" else []
    layers = [torch.nn.Linear(256, args.width), *norm, torch.nn.ReLU()]
    for _ in range(3):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 1))
    by_hand = args.case == "by-hand"
    ddp = model if by_hand else DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    count = 2 * args.batch * args.steps
    if args.case == "loader":
        data = SlowImages(count, load_ms=1.0)
    else:
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(count, 256, generator=g), torch.randn(count, 1, generator=g))
    loader = DataLoader(data, batch_size=args.batch, sampler=DistributedSampler(data, seed=0), drop_last=True)
    late = args.sleep_ms / 1e3
    slow_rank = 0 if args.case == "straggler-rank0" else 1
    if args.case == "straggler-in-forward" and rank == slow_rank:
        # the sleep falls inside DDP's forward, before its buffer broadcast: the others wait inside their forward
        ddp.register_forward_pre_hook(lambda module, inputs: time.sleep(late))
    for step, (x, y) in enumerate(loader):
        with torch.profiler.record_function("train_step") if args.case == "straggler-in-annotation" else _nothing():
            if args.case in ("straggler", "straggler-rank0", "straggler-in-annotation") and rank == slow_rank:
                time.sleep(late)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            if args.case == "late-both" and rank == 0:
                time.sleep(late)  # rank 0 late to the backward's all-reduce...
            loss.backward()
            if by_hand:
                for p in model.parameters():
                    dist.all_reduce(p.grad)
                    p.grad /= dist.get_world_size()
            if args.case == "late-both":
                if rank == 1:
                    time.sleep(late)  # ... and rank 1 late to the logging all-reduce
                logged = loss.detach().clone()
                dist.all_reduce(logged)
            optimizer.step()
    dist.destroy_process_group()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
