"""Training that checkpoints, resumes exactly, and survives a killed rank (lesson 07b).

    torchrun --standalone --nproc-per-node=2 ddp_scripts/train_resumable.py --checkpoint-dir ckpt
    ... --max-steps 37                       # stop after 37 steps, as a job's time limit would; run again to resume
    torchrun ... --max-restarts=1 ... --crash-rank 1 --crash-at-step 35   # SIGKILL rank 1 once; torchrun restarts

Rank 0 prints the SHA-256 of the final parameters: the same run, resumed or not, gives the same hash.
"""
import argparse
import json
import math
import os
import random
import signal
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset

import ddp_common  # import before init_process_group (see ddp_common.py)
from checkpointing import CheckpointError, load_checkpoint, load_model_state, newest_checkpoint, save_atomically
from exact_resume import ResumableSampler, params_sha256, rng_states, set_rng_states
from train_ddp import SmallCNN, digits  # lesson 04's model and data

# cuBLAS is deterministic only with a fixed workspace, read from this variable before CUDA starts. Unused on the CPU.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@record  # a failing rank's traceback goes into torchrun's report (lesson 00)
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"))
    parser.add_argument("--checkpoint-every", type=int, default=0, help="steps; 0: at the end of each epoch only")
    parser.add_argument("--max-steps", type=int, help="stop after this many steps in all, with a checkpoint")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--noise", type=float, default=0.1, help="augmentation: Gaussian noise on the inputs")
    parser.add_argument("--seed", type=int, default=0)
    lesson_only = parser.add_argument_group("lesson-only experiments: kill a rank once, leave a piece out")
    lesson_only.add_argument("--crash-rank", type=int, help="this rank SIGKILLs itself ...")
    lesson_only.add_argument("--crash-at-step", type=int, help="... after this step, on the first attempt only")
    lesson_only.add_argument("--resume-without", choices=["sampler_position", "rng_state"], help="the control")
    args = parser.parse_args()

    # Bad input is one line on every rank, before any rank waits for another.
    world_size, restart = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    train_set, _ = digits(args.seed)
    steps_per_epoch = math.ceil(math.ceil(len(train_set) / world_size) / args.batch_size)
    total_steps = args.epochs * steps_per_epoch
    for flag, value, least in (("--epochs", args.epochs, 1), ("--checkpoint-every", args.checkpoint_every, 0),
                               ("--max-steps", args.max_steps or 1, 1), ("--batch-size", args.batch_size, 1)):
        if value < least:
            sys.exit(f"{flag} must be >= {least}, got {value}")
    if (args.crash_rank is None) != (args.crash_at_step is None):  # the lesson-only flags
        sys.exit("--crash-rank and --crash-at-step go together")
    if args.crash_rank is not None and not 0 <= args.crash_rank < world_size:
        sys.exit(f"--crash-rank {args.crash_rank} is not a rank of this run (0..{world_size - 1})")
    if args.crash_at_step is not None and not 1 <= args.crash_at_step <= total_steps:
        sys.exit(f"--crash-at-step {args.crash_at_step} is outside this run: {args.epochs} epochs x "
                 f"{steps_per_epoch} steps = steps 1..{total_steps}")
    try:  # a real write: os.access() says yes to root even on a read-only file system
        args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        (args.checkpoint_dir / f".probe-{os.getpid()}").touch()
        (args.checkpoint_dir / f".probe-{os.getpid()}").unlink()
    except OSError as e:
        sys.exit(f"--checkpoint-dir {args.checkpoint_dir} is not writable: {e.strerror}")

    distributed = "RANK" in os.environ  # under torchrun; plain `python` runs one process
    if distributed:
        backend, device = ddp_common.backend_and_device()
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
        rank = dist.get_rank()
    else:
        device, rank = torch.device("cuda" if torch.cuda.is_available() else "cpu"), 0
    if device.type == "cuda":  # cuDNN and cuBLAS may pick kernels whose sums differ run to run
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = SmallCNN().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)  # stepped once per epoch
    sampler = ResumableSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
    # A generator of its own: each new DataLoader iterator draws a seed from it, not from torch's global RNG.
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, generator=torch.Generator())
    torch.manual_seed(args.seed + 1000 * rank)  # each rank its own noise
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)

    # Resume. Rank 0 picks the file, so that every rank resumes from the same one.
    chosen = [newest_checkpoint(args.checkpoint_dir)[0] if rank == 0 else None]
    if distributed:
        dist.broadcast_object_list(chosen, src=0)
    step, epoch, resumed_from, loss_at_resume, rng_to_restore = 0, 0, None, None, None
    if chosen[0] is not None:
        checkpoint = load_checkpoint(chosen[0])
        try:
            if not isinstance(checkpoint, dict) or "model" not in checkpoint or "rng" not in checkpoint:
                raise CheckpointError(f"{chosen[0]} is not a checkpoint of train_resumable.py")
            load_model_state(model, checkpoint["model"], chosen[0])  # before DDP, which broadcasts rank 0's
        except CheckpointError as e:
            sys.exit(str(e))
        optimizer.load_state_dict(checkpoint["optimizer"])  # momentum buffers, moved to the parameters' device
        scheduler.load_state_dict(checkpoint["scheduler"])
        step, epoch, resumed_from = checkpoint["step"], checkpoint["epoch"], checkpoint["step"]
        if rank == 0:
            print(f"resumed from {chosen[0].name}: step {step}, epoch {epoch}, "
                  f"batch {checkpoint['batches_done_in_epoch']} of {checkpoint['steps_per_epoch']}")
        if checkpoint["world_size"] == world_size:  # the same run goes on: the rest of the epoch, the same noise
            if args.resume_without != "sampler_position":  # (lesson-only: --resume-without leaves one out)
                sampler.skip = checkpoint["batches_done_in_epoch"] * args.batch_size
            if args.resume_without != "rng_state":
                rng_to_restore = checkpoint["rng"][rank]
        else:  # another world size (07b, section 4): the checkpoint's learning rates follow --lr
            scale = args.lr / scheduler.base_lrs[0]
            for group in optimizer.param_groups:
                group["lr"] *= scale
            scheduler.base_lrs = [lr * scale for lr in scheduler.base_lrs]
            if rank == 0:
                print(f"resuming a {checkpoint['world_size']}-rank checkpoint on {world_size} ranks: epoch {epoch} "
                      f"restarts, the global batch is {world_size * args.batch_size}, the learning rate is x{scale:g} "
                      "(--lr): a new run from the same weights")
        loss_at_resume = train_set_loss(model, train_set, rank, world_size, device, distributed)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None) if distributed else model
    if resumed_from is not None and distributed:
        # DDP's first backward reduces in one bucket in parameter order, later ones in buckets rebuilt in the order
        # gradients became ready; at 3+ ranks the layout changes the order of the float sums. One throwaway
        # backward (no step) puts the resumed run in the layout an uninterrupted run has.
        ddp(train_set[0][0].unsqueeze(0).to(device)).sum().backward()
        optimizer.zero_grad(set_to_none=True)
    if rng_to_restore is not None:  # last: train_set_loss's DataLoader drew its iterator's seed from torch's RNG
        set_rng_states(rng_to_restore)

    def save(epoch_to_resume, batches_done):
        everyone = [None] * world_size if rank == 0 else None
        if distributed:  # every rank's random state, to rank 0: each rank draws its own noise
            dist.gather_object(rng_states(), everyone, dst=0, weights_only=True)
        else:
            everyone = [rng_states()]
        if rank == 0:  # the global rank: on two nodes, local rank 0 exists twice
            save_atomically({
                "model": model.state_dict(),  # the plain model's: no "module." prefix
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "step": step, "epoch": epoch_to_resume, "batches_done_in_epoch": batches_done,
                "steps_per_epoch": steps_per_epoch, "world_size": world_size, "rng": everyone,
            }, args.checkpoint_dir / f"step_{step:06d}.pt")
            for old in sorted(args.checkpoint_dir.glob("step_*.pt"))[:-2]:  # keep the newest two
                old.unlink()
        if distributed:
            dist.barrier()  # nobody runs ahead while rank 0 writes

    stop = args.max_steps or math.inf  # else the epochs decide
    while epoch < args.epochs and step < stop:
        sampler.set_epoch(epoch)  # the epoch's shuffle; sampler.skip starts it part-way after a resume
        batches_done = steps_per_epoch - len(loader)
        ddp.train()
        for x, y in loader:
            x = x + args.noise * torch.randn(x.shape)  # on the CPU, from torch's global RNG
            loss = F.cross_entropy(ddp(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step, batches_done = step + 1, batches_done + 1
            if batches_done == steps_per_epoch:
                scheduler.step()
                save(epoch + 1, 0)
            elif (args.checkpoint_every and step % args.checkpoint_every == 0) or step == stop:
                save(epoch, batches_done)
            if rank == args.crash_rank and step == args.crash_at_step and restart == 0:  # lesson-only: the kill
                print(f"rank {rank}: SIGKILL at step {step} (attempt {restart})", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if step == stop:
                break
        if batches_done == steps_per_epoch:
            epoch, sampler.skip = epoch + 1, 0

    final_loss = train_set_loss(model, train_set, rank, world_size, device, distributed)
    digest = params_sha256(model)
    hashes = [None] * world_size
    if distributed:
        dist.all_gather_object(hashes, digest)
    else:
        hashes = [digest]
    if rank == 0:
        print(f"stopped after step {step}: train-set loss {final_loss:.4f}, params {digest[:12]}")
        print("RESULT " + json.dumps({
            "world_size": world_size, "steps_done": step, "resumed_from_step": resumed_from, "attempt": restart,
            "loss_at_resume": loss_at_resume, "final_loss": final_loss, "params_sha256": digest,
            "ranks_agree": len(set(hashes)) == 1,
            "checkpoints": sorted(p.name for p in args.checkpoint_dir.glob("step_*.pt"))}))
    if distributed:
        dist.destroy_process_group()


def train_set_loss(model, train_set, rank, world_size, device, distributed) -> float:
    """Mean loss of the current parameters over the whole training set, each sample once."""
    model.eval()  # the plain model, not the DDP wrapper: no collectives hidden in this forward
    totals = torch.zeros(2, device=device)
    with torch.no_grad():
        for x, y in DataLoader(Subset(train_set, range(rank, len(train_set), world_size)), batch_size=500):
            x, y = x.to(device), y.to(device)
            totals += torch.stack([F.cross_entropy(model(x), y, reduction="sum"), torch.full((), float(len(y)), device=device)])
    if distributed:
        dist.all_reduce(totals)
    return (totals[0] / totals[1]).item()


if __name__ == "__main__":
    main()
