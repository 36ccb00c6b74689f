"""Check of exercises/resume.py: save_checkpoint(path, ddp_model, optimizer, epoch, step) and
load_checkpoint(path, ddp_model, optimizer) -> (epoch, step), used by a training loop that stops mid-epoch.

At 2 and 3 ranks: an uninterrupted run, and a run that saves at epoch 1 step 2, then starts again from a
*different* model and optimizer, loads, and finishes. The resumed parameters must hash like the uninterrupted
ones. torch.save and torch.load are watched: who wrote (rank 0 only; its write is made slow, so a rank that
reads without waiting for it fails), and torch.load's arguments (a map_location; weights_only not turned off).
Then the learner's own train_loop, which owns the loop: stopped in epoch 1 of 3 (the middle one) and resumed by a new
model, the batches it trains must be those of an epoch loop with set_epoch, none twice, none skipped, in order: a
resume that starts again at epoch 0 trains an epoch twice, one that skips the done steps in every epoch leaves some
out. A checkpoint
written to a temporary file (a path or a file object) and renamed onto the path counts as a write of the path.
"""
import hashlib
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import common
from common import all_ranks, call, case, fail, load_learner, passed, start, worlds

EPOCHS, STEPS, STOP_AT = 2, 4, (1, 2)
READY_WAIT_S = 30  # rank 0's save waits at most this for the other ranks to be past their own save_checkpoint
SAVING = [""]  # the save under way ("2 ranks"...), while the learner's save_checkpoint and load_checkpoint run
saves, loads = [], []
real_save, real_load = torch.save, torch.load


def written_name(f) -> str:
    """A path, or the name of the file object torch.save was given (open(tmp, "wb"), as lesson 07 writes)."""
    return str(getattr(f, "name", f))


def watched_save(obj, f, *args, **kwargs):
    saves.append(written_name(f))
    if dist.is_initialized() and dist.get_rank() == 0 and SAVING[0]:
        # The slowest disk: rank 0 writes only once every other rank has tried to read, or waits in a collective
        # (a barrier) now. A rank that loads without waiting for this write then always finds no file.
        deadline = time.monotonic() + READY_WAIT_S
        waiting = set(range(1, dist.get_world_size()))
        while waiting and time.monotonic() < deadline:  # else a rank does neither (polls for the file?): write
            waiting = {rank for rank in waiting if not any(common._store.check([f"{SAVING[0]}/{event}/{rank}"])
                                                           for event in ("tried_to_load", "in_collective"))}
            time.sleep(0.02)
    return real_save(obj, f, *args, **kwargs)


def watched_rename(rename):
    """A checkpoint written to a temporary file and renamed onto the path (lesson 07's atomic save) is a write of the
    path: the rank that saved the temporary file wrote it."""
    def renamed(source, destination, *args, **kwargs):
        result = rename(source, destination, *args, **kwargs)
        if str(source) in saves:
            saves.append(str(destination))
        return result
    return renamed


def watched_load(f, *args, **kwargs):
    loads.append({"map_location": kwargs.get("map_location", args[0] if args else None),
                  "weights_only": kwargs.get("weights_only")})
    try:
        checkpoint = real_load(f, *args, **kwargs)
    except FileNotFoundError:
        tried_to_load()
        fail(f"rank {dist.get_rank()} read the checkpoint before rank 0 had written it: after rank 0 saves, "
             "every rank must wait for it (dist.barrier()) before loading")
    tried_to_load()
    return checkpoint


def tried_to_load():
    if SAVING[0] and dist.is_initialized():
        common._store.set(f"{SAVING[0]}/tried_to_load/{dist.get_rank()}", "yes")


def watched_collective(collective):
    """While the learner's functions run, a rank inside a collective says so on the store (for watched_save)."""
    def marked(*args, **kwargs):
        key = f"{SAVING[0]}/in_collective/{dist.get_rank()}" if SAVING[0] and dist.is_initialized() else None
        if key:
            common._store.set(key, "yes")
        try:
            return collective(*args, **kwargs)
        finally:
            if key:
                common._store.delete_key(key)
    return marked


torch.save, torch.load = watched_save, watched_load  # before the learner's file is imported
os.replace, os.rename = watched_rename(os.replace), watched_rename(os.rename)  # Path.replace and .rename call these
for name in ("barrier", "monitored_barrier", "all_reduce", "broadcast", "all_gather", "all_gather_object",
             "broadcast_object_list", "gather", "scatter", "reduce"):
    setattr(dist, name, watched_collective(getattr(dist, name)))


def lands_on(map_location, device) -> str:
    """Where torch.load(map_location=...) puts a tensor that was saved from cuda:0, by torch.serialization's rules:
    a device or a string is the place; a dict maps the saved location (one it lacks stays where it was saved); a
    function gets each storage and its saved location, and None from it means the saved location."""
    saved = "cuda:0"  # what a checkpoint written by rank 0 on a GPU holds: the place that must not be kept
    if isinstance(map_location, dict):
        return str(torch.device(map_location.get(saved, saved)))
    if isinstance(map_location, (str, torch.device)):
        return str(torch.device(map_location))
    try:
        moved = map_location(torch.UntypedStorage(1), saved)
    except Exception as error:  # e.g. .cuda() on a machine without one: judged where it would run
        return f"an error ({type(error).__name__}: {error})" if device.type != "cuda" else str(device)
    return saved if moved is None else str(moved.device)


def make_model(seed):
    torch.manual_seed(seed)
    # No biases: the gradients then become ready in the reverse order of the parameters, which is DDP's first
    # bucket layout too. Otherwise DDP's rebuilt layout (after a model's first step) differs from its first one,
    # gloo sums 3 ranks' values in a different order, and the last bits differ for a reason unrelated to resuming.
    model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 8, bias=False), torch.nn.Tanh(),
                                    torch.nn.Linear(8, 2, bias=False)))
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # momentum: state that must resume


def train(model, optimizer, begin=(0, 0), stop_at=None, learner=None, path=None):
    """The given training loop: (epoch, step) is where training continues; stop_at saves there and returns."""
    for epoch in range(begin[0], EPOCHS):
        for step in range(begin[1] if epoch == begin[0] else 0, STEPS):
            if (epoch, step) == stop_at:
                SAVING[0] = f"resume/{dist.get_world_size()} ranks"  # until load_checkpoint has returned
                call(learner.save_checkpoint, path, model, optimizer, epoch, step)
                return
            generator = torch.Generator().manual_seed(1000 * epoch + 10 * step + dist.get_rank())
            x, y = torch.randn(6, 4, generator=generator), torch.randn(6, 2, generator=generator)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()


LOOP_SAMPLES, LOOP_BATCH, LOOP_EPOCHS = 24, 2, 3  # 6 steps an epoch at 2 ranks, 4 at 3
LOOP_STOP = (1, 2)  # stopped at epoch 1 step 2: an epoch before it (a resume must not train it again) and one
# after it (where nothing may be skipped)


class StopHere(Exception):
    """The job's time is up, between two steps of the learner's train_loop."""


def loop_data():
    generator = torch.Generator().manual_seed(7)
    return TensorDataset(torch.arange(LOOP_SAMPLES), torch.randn(LOOP_SAMPLES, 4, generator=generator),
                         torch.randn(LOOP_SAMPLES, 2, generator=generator))


def expected_batches(dataset):
    """What an epoch loop with set_epoch trains on this rank: each batch's sample indices, epoch after epoch."""
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    batches = []
    for epoch in range(LOOP_EPOCHS):
        sampler.set_epoch(epoch)
        batches += [index.tolist() for index, _, _ in DataLoader(dataset, LOOP_BATCH, sampler=sampler)]
    return batches


def run_learner_loop(learner, seed, path, stop_after=None):
    """The learner's train_loop on a new model; train_step records each batch and raises StopHere when time is up."""
    model, optimizer = make_model(seed)
    dataset, trained = loop_data(), []

    def train_step(batch):
        if stop_after is not None and len(trained) == stop_after:
            raise StopHere
        index, x, y = batch
        trained.append(index.tolist())
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

    def train_loop(*args):  # named as the learner's, for call()'s one line
        try:
            learner.train_loop(*args)
        except StopHere:
            pass
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    call(train_loop, model, optimizer, sampler, DataLoader(dataset, LOOP_BATCH, sampler=sampler), LOOP_EPOCHS,
         str(path), train_step)
    return trained, model


def check_learner_loop(learner, workdir, n, where):
    case(f"{n} ranks: your train_loop, uninterrupted, then stopped mid-epoch and resumed by a new model")
    expected = expected_batches(loop_data())
    per_epoch = len(expected) // LOOP_EPOCHS
    straight, straight_model = run_learner_loop(learner, 0, workdir / f"loop_straight_{n}.pt")
    if straight != expected:
        fail(f"train_loop's uninterrupted run trained other batches than an epoch loop {where} (the first "
             f"difference at batch {first_difference(straight, expected)}): call sampler.set_epoch(epoch) at the "
             "start of every epoch, and train every batch of the loader once")
    stop_epoch, stop_step = LOOP_STOP
    path, stop_after = workdir / f"loop_{n}.pt", stop_epoch * per_epoch + stop_step
    before, _ = run_learner_loop(learner, 0, path, stop_after=stop_after)
    after, resumed_model = run_learner_loop(learner, 1, path)  # a different start: only the checkpoint can fix it
    trained, stop = before + after, f"stopped at epoch {stop_epoch} step {stop_step} ({stop_after} steps)"
    if len(trained) > len(expected):
        fail(f"train_loop {where}, {stop} and resumed, trained {len(trained) - len(expected)} batch(es) twice: "
             "the resumed run must start at the checkpoint's epoch and skip the steps it says are done")
    every_epoch = [b for i, b in enumerate(expected) if i < stop_after or i % per_epoch >= stop_step]
    if trained == every_epoch:
        fail(f"train_loop {where}, {stop} and resumed, skipped the first {stop_step} steps of every epoch after it "
             f"too ({len(expected) - len(trained)} batches never trained): skip steps only in the epoch the "
             "checkpoint was saved in (if epoch == start_epoch and step < start_step)")
    if len(trained) < len(expected):
        fail(f"train_loop {where}, {stop} and resumed, never trained {len(expected) - len(trained)} batch(es): "
             "skip exactly the steps the checkpoint says are done")
    if trained != expected:
        fail(f"train_loop {where}, {stop} and resumed, trained other batches than the uninterrupted run from "
             f"batch {first_difference(trained, expected)}: the resumed epoch needs sampler.set_epoch(epoch) with "
             "the checkpoint's epoch, before its loader is iterated")
    if parameters_hash(resumed_model) != parameters_hash(straight_model):
        fail(f"train_loop {where}: the resumed run trained the right batches but its parameters differ from the "
             "uninterrupted run's: load the checkpoint (model and optimizer) before training")
    all_ranks(None)  # every rank is done with the files
    if dist.get_rank() == 0:
        for name in (path, workdir / f"loop_straight_{n}.pt"):
            Path(name).unlink(missing_ok=True)


def first_difference(got, expected):
    return next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))


def parameters_hash(model):
    digest = hashlib.sha256()
    for p in model.module.parameters():
        digest.update(p.detach().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def main():
    start()
    learner = load_learner("save_checkpoint", "load_checkpoint", "train_loop")
    workdir = common.WORKDIR
    for n in worlds(2, 3):
        rank, where = dist.get_rank(), f"with {n} ranks"
        case(f"{n} ranks: an uninterrupted run, then one stopped at epoch {STOP_AT[0]} step {STOP_AT[1]}")
        model, optimizer = make_model(0)
        train(model, optimizer)
        uninterrupted = parameters_hash(model)

        path = str(workdir / f"checkpoint_{n}_ranks.pt")
        # The model that resumes, built now: building a DDP model is a collective (it broadcasts rank 0's
        # weights), which between the save and the load would be the barrier the learner must write.
        resumed, resumed_optimizer = make_model(1)  # a different start: only the checkpoint can make it right
        model, optimizer = make_model(0)
        saves.clear()
        train(model, optimizer, stop_at=STOP_AT, learner=learner, path=path)
        at_save = [p.detach().clone() for p in model.module.parameters()]
        momentum_at_save = [optimizer.state[p]["momentum_buffer"].clone() for p in model.module.parameters()]

        case(f"{n} ranks: resuming from the checkpoint into a new model and optimizer")
        model, optimizer = resumed, resumed_optimizer
        loads.clear()
        resumed_at = call(learner.load_checkpoint, path, model, optimizer)  # right after the save: no barrier of ours
        SAVING[0] = ""
        writers = [r for r, s in enumerate(all_ranks([f for f in saves if Path(f).name == Path(path).name])) if s]
        if writers != [0]:
            if not writers:
                fail(f"no rank wrote the checkpoint to the path it was given {where} (torch.save(state, path))")
            fail(f"rank(s) {writers} wrote the checkpoint {where}: only rank 0 should save "
                 "(if dist.get_rank() == 0), every rank holds the same weights")
        if not loads:
            fail(f"load_checkpoint did not call torch.load {where}")
        if any(load["map_location"] is None for load in loads):
            fail(f"torch.load without map_location {where}: give it the rank's own device "
                 "(map_location=device); on GPUs every rank would load rank 0's tensors onto cuda:0")
        device = next(model.parameters()).device
        for load in loads:
            landed = lands_on(load["map_location"], device)
            if load["map_location"] is not None and landed not in (str(device), "cpu"):  # "cpu": lesson 07's way
                fail(f"torch.load(map_location={load['map_location']!r}) {where} would put a tensor saved from cuda:0 "
                     f"on {landed}, not on this rank's device ({device}): give it the rank's own device "
                     "(map_location=device) or the CPU")
        if any(load["weights_only"] is False for load in loads):
            fail(f"torch.load(weights_only=False) {where}: a checkpoint of tensors, numbers and dicts loads with "
                 "weights_only=True, which runs no code from the file")
        if tuple(resumed_at or ()) != STOP_AT:
            fail(f"load_checkpoint returned {resumed_at!r} {where}; the checkpoint was saved at (epoch, step) = "
                 f"{STOP_AT}")
        if any(not torch.equal(p, q) for p, q in zip(model.module.parameters(), at_save)):
            fail(f"after load_checkpoint the model's parameters differ from those saved {where}")
        state = [optimizer.state.get(p, {}).get("momentum_buffer") for p in model.module.parameters()]
        if any(s is None or not torch.equal(s, m) for s, m in zip(state, momentum_at_save)):
            fail(f"after load_checkpoint the optimizer's state (SGD's momentum) differs from the one saved {where}: "
                 "save optimizer.state_dict() and load it back")
        train(model, optimizer, begin=tuple(resumed_at))
        hashes = all_ranks(parameters_hash(model))
        if hashes[0] != uninterrupted:
            fail(f"the resumed run's parameters hash {hashes[0]}, the uninterrupted run's {uninterrupted} {where}")
        if rank == 0:
            Path(path).unlink(missing_ok=True)
        check_learner_loop(learner, workdir, n, where)
    passed(f"2 and 3 ranks: resumed from epoch {STOP_AT[0]} step {STOP_AT[1]}, parameters hash like the "
           "uninterrupted run's; only rank 0 wrote; torch.load with map_location, weights_only not turned off; "
           "your train_loop, stopped mid-epoch and resumed, trained every batch once, in order")


if __name__ == "__main__":
    main()
