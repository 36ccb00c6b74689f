"""Check of exercises/convert_to_ddp.py: the learner's DDP version of exercises/single_process_train.py.

The learner's script runs as __main__ in each rank (runpy), at 2 and then 3 ranks in one launch: its own
init_process_group() gets a fresh process group of that size (the store, rank and world size are filled in).
Measured meanwhile, never read from the script's prints: which ranks called torch.save on --out, which samples
each rank's DataLoader fetched in which batches, and the saved parameters, which must equal one process's run of
exercises/single_process_train.py with the same flags (run here too, with variants that name the mistakes).
"""
import contextlib
import io
import json
import os
import runpy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data._utils import fetch

from common import RANK, case, fail, learner_path, passed, start
import common

SINGLE_PROCESS = common.EXERCISES / "single_process_train.py"
EPOCHS, BATCH, LR, SEED, SAMPLES = 2, 24, 0.05, 0, 1500
recording = {"saves": [], "batches": [], "inits": 0}
captured = {}  # the single-process runs' state_dicts, kept in memory
real_save, real_init, real_fetch = torch.save, dist.init_process_group, fetch._MapDatasetFetcher.fetch


def watched_save(obj, f, *args, **kwargs):
    if "capture" in captured:  # a reference run: keep it, write nothing
        captured[captured.pop("capture")] = obj
        return None
    recording["saves"].append(str(f))
    return real_save(obj, f, *args, **kwargs)


def watched_fetch(self, possibly_batched_index):
    if self.auto_collation:
        recording["batches"].append([int(i) for i in possibly_batched_index])
    return real_fetch(self, possibly_batched_index)


torch.save, fetch._MapDatasetFetcher.fetch = watched_save, watched_fetch


def run_learner(n, out):
    """The learner's script as __main__, its process group this world of n ranks."""
    def init_process_group(backend=None, init_method=None, *args, **kwargs):
        recording["inits"] += 1
        kwargs.update(store=dist.PrefixStore(f"convert_to_ddp_{n}", common._store), rank=RANK, world_size=n)
        return real_init(backend or "gloo", *args, **kwargs)
    dist.init_process_group = init_process_group
    os.environ.update(WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n))
    sys.argv = [str(learner_path()), "--epochs", str(EPOCHS), "--batch-size", str(BATCH), "--lr", str(LR),
                "--seed", str(SEED), "--out", out]
    try:
        runpy.run_path(str(learner_path()), run_name="__main__")
    except SystemExit as end:
        if end.code not in (None, 0):
            fail(f"the script exited with {end.code!r} with {n} ranks")
    except BaseException as error:
        import traceback
        traceback.print_exc()
        first = str(error).splitlines()[0] if str(error) else ""
        fail(f"the script raised on rank {RANK} with {n} ranks: {type(error).__name__}: {first}")
    finally:
        dist.init_process_group = real_init
    if dist.is_initialized():  # the learner did not shut it down: we do, before the next world
        dist.destroy_process_group()


def single_process(batch_size, lr):
    """exercises/single_process_train.py's final state_dict with these flags (in this process, quietly)."""
    key = (batch_size, lr)
    if key not in captured:
        captured["capture"] = key
        sys.argv = [str(SINGLE_PROCESS), "--epochs", str(EPOCHS), "--batch-size", str(batch_size), "--lr", str(lr),
                    "--seed", str(SEED), "--out", "unused.pt"]
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(SINGLE_PROCESS), run_name="__main__")
    return captured[key]


def distance(a, b):
    if set(a) != set(b):
        return float("inf")
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def verdict(n, out, measured):
    """Rank 0: what went wrong at n ranks, measured; None if the run equals the single-process run."""
    where = f"with {n} ranks"
    if not all(m["inits"] for m in measured):
        return (f"the script never called dist.init_process_group() {where}: under torchrun each rank trained "
                "alone, on everything")
    writers = [r for r, m in enumerate(measured) if any(Path(s).name == Path(out).name for s in m["saves"])]
    if writers != [0]:
        if 0 not in writers:
            return f"rank 0 did not save --out {where} (torch.save(state_dict, args.out))"
        return (f"ranks {writers} all wrote --out {where}: only rank 0 should save (if rank == 0), the ranks hold "
                "the same weights and would overwrite one file at the same time")
    state = torch.load(out, map_location="cpu", weights_only=True)
    if any(k.startswith("module.") for k in state):
        return (f"the saved keys start with 'module.' {where}: save model.module.state_dict(), the plain model "
                "inside DDP, so that the file loads into the model without DDP")
    samples = [sum(len(b) for b in m["batches"]) for m in measured]
    if samples and min(samples) >= EPOCHS * SAMPLES:
        return (f"each rank trained on all {SAMPLES} samples every epoch {where} (no DistributedSampler with "
                "num_replicas=world_size): every rank must take its own 1/N of the data")
    first_batch = len(measured[0]["batches"][0]) if measured[0]["batches"] else 0
    if first_batch and first_batch != BATCH // n:
        return (f"rank 0's batches had {first_batch} samples {where}; --batch-size {BATCH} is the global batch, "
                f"so each rank takes {BATCH} // {n} = {BATCH // n}")
    for r, m in enumerate(measured):
        order = [i for b in m["batches"] for i in b]
        half = len(order) // EPOCHS
        if half and order[:half] == order[half:2 * half]:
            return (f"rank {r} saw epoch 1 in epoch 0's order {where}: call sampler.set_epoch(epoch) at the start "
                    "of each epoch, or the DistributedSampler shuffles the same way every time")
    reference = single_process(BATCH, LR)
    if distance(state, reference) < 1e-4:
        return None
    if distance(state, single_process(BATCH, LR * n)) < 1e-4:
        return (f"the update is {n}x too large {where}: the loss or the learning rate was scaled up by the world "
                "size. With --batch-size as the global batch, DDP's average gradient already equals one process's")
    if distance(state, single_process(BATCH, LR / n)) < 1e-4:
        return (f"the update is {n}x too small {where}: the loss or the learning rate was divided by the world "
                "size. DDP already averages the gradients over the ranks")
    return (f"the final parameters differ from the single-process run's by up to {distance(state, reference):.3g} "
            f"{where} (the same flags should give the same parameters)")


def main():
    workdir = common.WORKDIR
    start()
    for n in (2, 3):
        if RANK >= n:
            continue
        case(f"{n} ranks: {learner_path().name} --epochs {EPOCHS} --batch-size {BATCH} --lr {LR} --seed {SEED}")
        out = str(workdir / f"model_{n}_ranks.pt")
        recording.update(saves=[], batches=[], inits=0)
        run_learner(n, out)
        common._store.set(f"convert_to_ddp_{n}_measured_{RANK}", json.dumps(recording))
        if RANK == 0:
            measured = [json.loads(common._store.get(f"convert_to_ddp_{n}_measured_{r}")) for r in range(n)]
            if not Path(out).exists():
                fail(f"rank 0 did not write --out with {n} ranks")
            problem = verdict(n, out, measured)
            if problem:
                fail(problem)
    passed(f"2 and 3 ranks, --batch-size {BATCH} as the global batch: the final parameters equal one process's run "
           "of single_process_train.py; rank 0 alone wrote --out, keys without 'module.'")


if __name__ == "__main__":
    main()
