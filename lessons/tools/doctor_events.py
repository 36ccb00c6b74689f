"""The DDP doctor's events: what each rank's instruments write (lessons/tools/doctor_site/sitecustomize.py), one JSON
object a line, and what the doctor's rules (lessons/tools/doctor_rules.py and its areas) and doctor_compare.py
read; and the names of each rank's parameters file (PARAMS). This is the one description of them; tests/test_doctor.py checks every event and every
parameter's name of a real run against it.

Each event is {"event": NAME, **fields}; FIELDS[NAME] gives every field and the types its value may have.
"site" is the script's file:line that caused the event (the first frame outside torch and the instruments);
"steps" counts the optimizer steps taken so far on this rank.
"""
INT, FLOAT, STR, BOOL, NONE, LIST, DICT = int, float, str, bool, type(None), list, dict

FIELDS = {
    # the instruments loaded in this rank: without it, the doctor did not see the rank
    "start": {"rank": (INT,), "pid": (INT,), "torch": (STR,)},
    # data: a DistributedSampler, a DataLoader, a pass over a loader, its batches, its end
    "sampler": {"sampler": (INT,), "site": (STR,), "num_replicas": (INT,), "rank": (INT,), "shuffle": (BOOL,),
                "seed": (INT,), "drop_last": (BOOL,), "dataset": (STR,), "length": (INT,)},
    "loader": {"loader": (INT,), "site": (STR,), "batch_size": (INT, NONE), "asked_batch_size": (INT, NONE),
               "sampler": (INT, NONE), "sampler_type": (STR,), "batch_sampler": (STR, NONE), "dataset": (STR,),
               "length": (INT, NONE), "drop_last": (BOOL,), "base_dataset": (STR, NONE), "base_indices": (LIST, NONE)},
    # "sampler_type": the sampler it draws from (a batch_sampler's own, when it was given one); "base_dataset": the
    # fingerprint of the data set beneath its Subsets, "base_indices" each index of the loader's data set as an index
    # into that one (None when it is no Subset, or a huge one: then base_dataset is None too)
    # a pass starts at iter(loader), or at a persistent iterator's reset; "joined": inside a Join context
    "pass": {"loader": (INT,), "number": (INT,), "site": (STR,), "steps": (INT,), "sampler": (INT, NONE),
             "epoch": (INT, NONE), "joined": (BOOL,)},
    "batch": {"loader": (INT,), "number": (INT,), "n": (INT,), "steps": (INT,)},
    # "complete": False when the pass was left before StopIteration (a loop that counts its batches, a break): it
    # ended when the loader's next pass began, or at exit; "batch_sizes": the indices each batch took, in order
    "pass_end": {"loader": (INT,), "number": (INT,), "batches": (INT,), "steps": (INT,), "indices": (LIST, NONE),
                 "batch_sizes": (LIST, NONE), "complete": (BOOL,)},
    # models and optimizers
    "optimizer": {"optimizer": (INT,), "site": (STR,), "kind": (STR,)},
    "rng_per_step": {"site": (STR,), "steps": (INT,)},
    # "dropout": the DDP-wrapped module's first layer that draws random numbers ("Dropout(p=0.2)", "DropPath(p=0.1)"),
    # None when it has none
    # "batch_norm": its first BatchNorm layer that is not a SyncBatchNorm ("BatchNorm1d"), None when none
    "wrapper": {"kind": (STR,), "site": (STR,), "dropout": (STR, NONE), "batch_norm": (STR, NONE)},
    # the first entry into autocast at each (device, dtype): the precision the steps ran in
    "autocast": {"device": (STR,), "dtype": (STR,), "site": (STR,)},
    # the process group and collectives
    "init": {"site": (STR,), "rank_given": (INT, NONE), "env_rank": (INT,), "local_rank": (INT,),
             "world_size": (INT,)},
    "collective": {"op": (STR,), "site": (STR,), "shape": (LIST, NONE), "steps": (INT,)},
    "spawn": {"site": (STR,), "call": (STR,)},
    # --compare only: the script's integer options as parsed, [["--batch-size", 8], ...] (a per-rank batch flag)
    # "numbers": its float options, [["--dropout", 0.1], ...] (a dropout to switch off for the comparison)
    "arguments": {"site": (STR,), "options": (LIST,), "numbers": (LIST,)},
    # checkpoints
    "save": {"path": (STR,), "site": (STR,), "devices": (LIST,)},
    "load": {"path": (STR,), "site": (STR,), "map_location": (STR, DICT, NONE), "weights_only": (BOOL, NONE),
             "saved_from": (LIST, NONE)},
    # the end: whether the group was left, and what was counted
    # "rng_first_step": a digest of the random state (CPU, and CUDA where it runs) after the first optimizer step;
    # "rng_first_batch": the same when the first step's batch was drawn, before its forward (ranks whose batches
    # differ in shape draw different counts of numbers in the step, from one state: the same masks, cut otherwise)
    # "first_lrs": each optimizer's learning rates (one a param group) at its first step, None if it never stepped
    # "travelled": under --compare, the sum over the steps of the largest change of a parameter in each step
    "exit": {"initialized": (BOOL,), "steps": (INT,), "optimizers": (INT,), "ddp_modules": (INT,),
             "rng_per_step": (BOOL,), "rng_first_step": (STR, NONE), "rng_first_batch": (STR, NONE),
             "first_lrs": (LIST,),
             "travelled": (FLOAT, INT)},
}


# Each rank's parameters file (rank<R>.params.pt, written at exit, read with weights_only=True): a dict of tensors,
# each name matching one pattern here. What a parameter *is* decides its name (sitecustomize.py's what_it_is).
PARAMS = {
    r"opt\d+\.\d+": "a module's parameter held by optimizer i (j-th in its param_groups), at exit: a replica, compared"
                     " between ranks and with one process",
    r"dshard\d+\.opt\d+\.\d+": "a DTensor parameter's rows on this rank (FSDP2's Shard(0) over a 1-D mesh),"
                                   " named by its place on the mesh: put together in that order, the parameter",
    r"flat\.opt\d+\.\d+": "a FullyShardedDataParallel flat parameter's shard: this rank's part of one flat vector",
    r"own\.opt\d+\.\d+": "a tensor of the rank's own: a parameter of a module FSDP shards, or no module's parameter"
                          " (a ZeRO partition written by hand)",
    r"start\.opt\d+\.\d+": "--compare only: a module's parameter before the optimizer's first step",
    r"first\.opt\d+\.\d+": "--compare only: a module's parameter after the optimizer's first step",
    r"firstsum\.opt\d+": "after the first step, (sum, sum of |x|) of each module parameter: float64, one row a tensor",
    r"ddp\d+\..+": "a parameter of the i-th module DDP wraps, by its name, at exit",
}


def param_problems(name: str) -> list[str]:
    """What is wrong with one name of a parameters file against PARAMS."""
    import re
    return [] if any(re.fullmatch(pattern, name) for pattern in PARAMS) else [f"undescribed parameter {name!r}"]


def problems(event: dict) -> list[str]:
    """What is wrong with one event against FIELDS: an unknown name, a missing or extra field, a wrong type."""
    name = event.get("event")
    if name not in FIELDS:
        return [f"unknown event {name!r}"]
    wanted, found = FIELDS[name], {k: v for k, v in event.items() if k != "event"}
    wrong = [f"{name}: missing {k}" for k in wanted.keys() - found.keys()]
    wrong += [f"{name}: unexpected {k}" for k in found.keys() - wanted.keys()]
    wrong += [f"{name}.{k} is {type(v).__name__}, not {' or '.join(t.__name__ for t in wanted[k])}"
              for k, v in found.items() if k in wanted and not isinstance(v, wanted[k])
              or (isinstance(v, bool) and BOOL not in wanted.get(k, (BOOL,)))]
    return wrong
