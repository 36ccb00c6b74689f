"""The DDP doctor's --compare: N ranks against one process given their global batch, parameters compared.

The one process runs the script as the ranks did (lessons/tools/doctor_launch.py), with the instruments told what
to give it: the loader's batch at N times the per-rank batch (and the script's own per-rank batch flag at N times
its value), or the union of the ranks' batches for a loader with a batch_sampler.
"""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from . import doctor_launch
from .doctor_record import Record, passes_of

if TYPE_CHECKING:
    from .doctor_report import DoctorReport

COMPARE_RTOL = 1e-4  # N ranks against one process: other summation orders, amplified over the steps (lesson 04)
LOW_PRECISION = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}  # a unit roundoff: autocast's steps round to it


# --- --compare: N ranks against one process with their batch ---------------------------------------------------

def _compare(script, nproc, args, timeout, alone, many: DoctorReport, record: Record | None,
             started: float = float("inf")) -> tuple[list[str], int]:
    """--compare: run SCRIPT as one process (ALONE: its "env" and "cwd") with the ranks' global batch, and compare
    the trained parameters with the ranks'. (lines, status): 0 the same model, 1 not, 2 no comparison."""
    import torch

    def cannot(why, lines=()):
        return [*lines, f"compare: no comparison: {why}"], 2

    if record is None or many.error:
        return cannot(f"the run on {nproc} ranks did not finish")
    reference_rank = min(record.events)
    training = [p for p in passes_of(record.events[reference_rank]) if p.trained]
    if not training:
        return cannot("no optimizer step inside a pass over a DataLoader (batches made by hand, or an iterable"
                      " data set): the doctor can't give one process the ranks' batches")
    counts = {}
    for p in training:
        counts[p.loader["site"]] = counts.get(p.loader["site"], 0) + p.batches
    site = max(counts, key=counts.get)
    loader = next(p.loader for p in training if p.loader["site"] == site)
    per_rank = loader["batch_size"]
    if loader["sampler_type"] == "_InfiniteConstantSampler":
        return cannot(f"the loader made at {site} reads an iterable data set: each rank's stream is its own, and the"
                      " doctor can't give one process the union of the ranks' samples")
    one_env, one_args, flag = {"LESSONS_DOCTOR_COMPARE": "1"}, [str(a) for a in args], None
    if per_rank is None:  # a batch_sampler (Accelerate's loaders): the one process gets the ranks' batches, unioned
        passes = _ranks_batches(record, site)
        if passes is None:
            return cannot(f"the loader made at {site} takes its batches from a batch_sampler"
                          f" ({loader['batch_sampler']}) and its indices were not recorded: the doctor can't give"
                          " one process the ranks' global batch")
        made_there = [e["loader"] for e in record.events[reference_rank] if e["event"] == "loader"
                      and e["site"] == site]  # a library's one line makes every loader: the training one is the k-th
        one_env["LESSONS_DOCTOR_BATCHES"] = json.dumps({"site": site, "ordinal": made_there.index(loader["loader"]),
                                                        "passes": passes})
        per_rank = max(len(b) for b in passes[0]) // nproc
        whole = per_rank * nproc
        flag = _batch_flag(record, per_rank) if nproc > 1 else None
        if flag:  # the script's own per-rank flag too, at N times its value: a loss normalized by it stays right
            one_args += [flag, str(whole)]
        batch_line = (f"compare: batch: each rank's loader (made at {site}) takes its batches from a batch_sampler"
                      f" ({loader['batch_sampler']}), {per_rank} a step; one process was given the union of the"
                      f" {nproc} ranks' batches, step by step ({whole} a step)"
                      + (f", and {flag} {whole} (the script's {flag} holds the per-rank {per_rank})" if flag else ""))
    else:
        whole = per_rank * nproc
        one_env["LESSONS_DOCTOR_BATCH"] = json.dumps({"site": site, "batch": whole})
        if loader["asked_batch_size"] == per_rank and nproc > 1:
            flag = _batch_flag(record, per_rank)
            if flag:  # the script's own flag at N times its value: the loss sees the batch it trains on
                one_args += [flag, str(whole)]
        batch_line = None
    if alone.get("cwd"):  # its sites named from the ranks' folder, as theirs are: the loader's site matches
        one_env["LESSONS_DOCTOR_SITE_ROOT"] = os.getcwd()
    single, single_record = doctor_launch._run(script, 1, one_args, timeout, False, alone.get("env"), 1, one_env,
                                 cwd=alone.get("cwd"))
    resumed = _read_what_the_ranks_wrote(record, single_record, started) if single_record is not None else None
    if resumed:  # first: a resume from the ranks' checkpoint is often why the one process failed, too
        return cannot(resumed)
    if single_record is None or single.error:
        return cannot(f"the run as one process did not finish: {single.error}")
    if batch_line is None:
        asked = next((e["asked_batch_size"] for e in single_record.events[0] if e["event"] == "loader"
                      and e["site"] == site), None)
        if asked == whole and flag:
            how = f"its {flag} is per rank ({per_rank}): the doctor gave one process {flag} {whole}"
        elif asked == whole:
            how = "the script asked for it itself: its batch flag is global"
        elif flag:
            how = (f"its {flag} is per rank ({per_rank}); given {flag} {whole}, one process's loader still asked for"
                   f" {asked}, so the doctor resized the loader to {whole}")
        else:
            how = (f"the script asked for {asked} (its batch is per rank), and none of its options holds {asked}:"
                   f" the doctor resized the loader to {whole} (a loss divided by a per-rank number of the script's"
                   " would now be off by N)")
        batch_line = (f"compare: batch: each rank's loader (made at {site}) drew {per_rank} a step, {whole} on"
                      f" {nproc} ranks; one process drew {whole}: {how}")
    grouped = any(e["event"] == "init" for evs in record.events.values() for e in evs)
    lines = [batch_line] if grouped else []  # no process group: no rank's batch is a part of a global one
    ranks_params = _assembled(record)
    one_params = _assembled(single_record)
    names = sorted(n for n in ranks_params if n.startswith(("opt", "flat.")))
    if not names or names != sorted(n for n in one_params if n.startswith(("opt", "flat."))):
        return cannot("the optimizers' parameters of the two runs don't match up (another model or optimizer on"
                      " one process, or parameters sharded in a way the doctor can't put together: DTensors)", lines)
    for n in names:
        if n.startswith("flat."):  # the one process's flat parameter is unpadded: the ranks' shards end in padding
            ranks_params[n] = ranks_params[n][:one_params[n].numel()]
    for n in names:  # a 1-element parameter sharded as [1] on the ranks (FSDP2 can't shard a 0-d one), () alone
        if ranks_params[n].shape != one_params[n].shape and ranks_params[n].squeeze().shape == \
                one_params[n].squeeze().shape:
            ranks_params[n] = ranks_params[n].reshape(one_params[n].shape)
    unlike = [n for n in names if ranks_params[n].shape != one_params[n].shape]
    if unlike:
        return cannot(f"a parameter has another shape on the ranks ({tuple(ranks_params[unlike[0]].shape)}) than in"
                      f" one process ({tuple(one_params[unlike[0]].shape)}): sharded in a way the doctor can't put"
                      " together", lines)
    exits = [next((e for e in r.events[min(r.events)] if e["event"] == "exit"), {}) for r in (record, single_record)]
    steps = [e.get("steps") for e in exits]
    diverged = [who for who, params in ((f"the {nproc} ranks", ranks_params), ("one process", one_params))
                if not all(torch.isfinite(params[n]).all() for n in names)]
    if diverged:
        return lines + [f"compare: {nproc} ranks and one process differ: the weights of {' and '.join(diverged)} are"
                        " not finite (the training diverged)"], 1
    scale = max(max(one_params[n].abs().max().item() for n in names if one_params[n].numel()), 1.0)
    lowered = sorted({(e["dtype"], e["site"]) for r in (record, single_record) for evs in r.events.values()
                      for e in evs if e["event"] == "autocast" and e["dtype"] in LOW_PRECISION})
    travelled = max(float(e.get("travelled") or 0.0) for e in exits)
    tolerance = COMPARE_RTOL * scale
    if lowered:
        # Under autocast each step's update is off by about the precision's roundoff, another summation order on N
        # ranks or not: the runs part by up to the roundoff times the distance the weights travelled (the sum of
        # each step's largest change, measured), on top of the roundoff of the weights themselves.
        unit = max(LOW_PRECISION[dtype] for dtype, _ in lowered)
        tolerance = max(tolerance, unit * (scale + travelled))
    diff = max((ranks_params[n] - one_params[n]).abs().max().item() for n in names if one_params[n].numel())
    moved = [(one_params[n] - one_params[f"start.{n}"]).abs().max().item() for n in names
             if one_params[n].numel() and f"start.{n}" in one_params]
    if moved and max(moved) <= tolerance:
        return cannot(f"training moved the parameters by at most {max(moved):.2g}, within the tolerance"
                      f" ({tolerance:.0e}): any two runs would agree to it. Compare more steps, or a larger"
                      " learning rate", lines)
    drawn, samples_match = _samples_per_step(record, single_record, site, per_rank, nproc)
    if samples_match is False:
        return cannot(f"{drawn}: the two runs trained on other samples, so their weights say nothing about DDP."
                      " Give the one process the ranks' sampler (a DistributedSampler works with one process too)",
                      lines)
    lines.append(f"compare: samples: {drawn}")
    same = diff <= tolerance and steps[0] == steps[1]
    verdict = "train the same model" if same else "differ"
    lines.append(f"compare: {nproc} ranks and one process {verdict}: largest parameter difference {diff:.2g}"
                 f" (tolerance {tolerance:.0e}), after {steps[0]} steps on {nproc} ranks and {steps[1]} in one"
                 " process")
    if lowered:
        dtype, where = lowered[0]
        lines.append(f"compare: note: the steps ran under autocast to {dtype} (at {where}): the tolerance is that"
                     f" precision's roundoff, {LOW_PRECISION[dtype]:.0e}, times the weights' scale ({scale:.2g}) and"
                     f" the distance they travelled ({travelled:.2g}: the sum of each step's largest change), not"
                     f" float32's {COMPARE_RTOL:.0e} of the scale")
    if not same:
        lines += _compare_reasons(record, single_record, ranks_params, one_params, names, nproc, steps, torch)
        norm = next((e for evs in record.events.values() for e in evs if e["event"] == "wrapper"
                     and e.get("batch_norm")), None)
        if norm:
            lines.append(f"compare: note: the model has {norm['batch_norm']} (wrapped at {norm['site']}): in training"
                         f" each rank normalizes with its own {per_rank} samples' statistics, one process with all"
                         f" {whole}, so the runs differ without a mistake; SyncBatchNorm makes them one (lesson 08)")
    if any(next((e["rng_per_step"] for e in evs if e["event"] == "exit"), False) for r in (record, single_record)
           for evs in r.events.values()):
        lines.append("compare: note: the script draws random numbers during its steps (dropout, random"
                     " augmentation, batches drawn at random): the ranks draw other numbers than one process, so the"
                     f" runs can differ without a mistake; switch them off to compare{_dropout_off(record)}")
    return lines, 0 if same else 1


def _dropout_off(record: Record) -> str:
    """How to switch the model's dropout off for a comparison: its probability at 0, through the script's own
    option when it has one. Not model.eval(): that also switches BatchNorm to its running statistics mid-training."""
    layer = next((e["dropout"] for evs in record.events.values() for e in evs if e["event"] == "wrapper"
                  and e.get("dropout")), None)
    if layer is None:
        return ""
    numbers = [o for e in record.events[min(record.events)] if e["event"] == "arguments" for o in e.get("numbers", [])]
    flag = next((f for f, value in numbers if "drop" in f.lower() and value > 0), None)
    how = f"run both with {flag} 0 (the script's own option)" if flag else "set its p to 0 for both runs"
    return (f" (the model's {layer}: {how}; not model.eval(), which also switches BatchNorm to its running"
            " statistics)")


def _batch_flag(record: Record, per_rank: int) -> str | None:
    """The script's option that holds the per-rank batch size (its value equals it; a name with "batch" first)."""
    options = [o for e in record.events[min(record.events)] if e["event"] == "arguments" for o in e["options"]]
    holding = sorted({flag for flag, value in options if value == per_rank})
    named = [flag for flag in holding if "batch" in flag.lower()]
    chosen = named if named else holding
    return chosen[0] if len(chosen) == 1 else None


def _ranks_batches(record: Record, site: str) -> list | None:
    """Each training pass of the loader made at SITE, as the list of its steps' global batches: at each step, the
    union of the ranks' batches (in rank order). None when a rank's indices or batch sizes were not recorded."""
    per_rank = {}
    for rank, events in sorted(record.events.items()):
        passes = [p for p in passes_of(events) if p.trained and p.loader["site"] == site]
        ends = {(e["loader"], e["number"]): e for e in events if e["event"] == "pass_end"}
        cut = []
        for p in passes:
            end = ends.get((p.loader["loader"], p.number))
            if p.indices is None or end is None or not end.get("batch_sizes"):
                return None
            batches, at = [], 0
            for size in end["batch_sizes"]:
                batches.append(p.indices[at:at + size])
                at += size
            cut.append(batches)
        per_rank[rank] = cut
    passes = []
    for number in range(min(len(cut) for cut in per_rank.values())):
        steps = min(len(cut[number]) for cut in per_rank.values())
        passes.append([[i for rank in sorted(per_rank) for i in per_rank[rank][number][step]]
                       for step in range(steps)])
    return passes or None


def _assembled(record: Record) -> dict:
    """The reference rank's parameters, each FSDP flat parameter put together from the ranks' shards (rank order),
    and each FSDP2 DTensor parameter from its rows on the mesh (dshard<k>: the k-th place), named as a replicated
    parameter is (opt<i>.<j>)."""
    import torch

    reference = dict(record.params.get(min(record.events), {}))
    for name in [n for n in reference if n.startswith("flat.")]:
        reference[name] = torch.cat([record.params[rank][name] for rank in sorted(record.params)
                                     if name in record.params[rank]])
    rows = {}  # opt<i>.<j> -> {place: tensor}
    for tensors in record.params.values():
        for name, tensor in tensors.items():
            if name.startswith("dshard"):
                place, parameter = name.removeprefix("dshard").split(".", 1)
                rows.setdefault(parameter, {}).setdefault(int(place), tensor)
    for name in [n for n in reference if n.startswith("dshard")]:
        del reference[name]
    for parameter, by_place in rows.items():
        reference[parameter] = torch.cat([by_place[k] for k in sorted(by_place)])
    return reference


def _read_what_the_ranks_wrote(record: Record, single_record: Record, started: float) -> str | None:
    """Why the comparison means nothing when the one process, before its first batch, loaded a file the ranks' run
    wrote (saved there, or moved there by os.replace after a save), and that it had not written itself earlier in
    its own run: it resumed from their result (a --checkpoint that is also a --resume)."""
    written = set()
    for e in single_record.events[0]:
        if e["event"] == "batch":
            return None
        if e["event"] == "save":
            written.add(os.path.abspath(e["path"]))
        if e["event"] == "load" and os.path.isfile(e["path"]) and os.path.getmtime(e["path"]) >= started \
                and os.path.abspath(e["path"]) not in written:
            return (f"the run as one process read {e['path']} at {e['site']}, which the ranks' run had just written:"
                    " it resumed from their result instead of training from the start. The one process runs with"
                    " the ranks' arguments, environment and folder: give it its own with --one-process-env"
                    " NAME=VALUE (a folder named by the environment) or --one-process-cwd DIR (a relative path), or"
                    " give the script a path that starts from nothing")
    return None


def _samples_per_step(record: Record, single_record: Record, site: str, per_rank: int, nproc: int):
    """(a line, True/False/None): at each step of the training passes of the loader made at SITE, did the one
    process draw the union of the ranks' samples? The last step of a pass is left out (a DistributedSampler pads
    the ranks' shards to one length there); None when the indices were not recorded."""
    def training_passes(events):
        return [p for p in passes_of(events) if p.trained and p.loader["site"] == site and p.indices is not None]

    ranks = {rank: training_passes(events) for rank, events in record.events.items()}
    one = training_passes(single_record.events[0])
    read = {p.loader["dataset"] for ps in ranks.values() for p in ps[:1]}
    if len(read) > 1:  # each rank's own part (data sharded by hand): indices into different data sets
        return ("not compared: the ranks' loaders made there read different data sets (each rank its own part?),"
                " so their indices don't name the same samples"), None
    whole, compared, ran, passes = per_rank * nproc, 0, 0, 0
    for number, single in enumerate(one):
        mine = [ps[number].indices for ps in ranks.values() if number < len(ps)]
        if len(mine) < nproc:
            break
        in_pass = -(-min(len(m) for m in mine) // per_rank)  # the ranks' steps, the last one partial or padded
        ran, passes = ran + in_pass, passes + 1
        steps = min(len(single.indices) // whole, in_pass - 1)  # the last left out, and any the one process lacks
        for step in range(max(steps, 0)):
            union = set().union(*(set(m[step * per_rank:(step + 1) * per_rank]) for m in mine))
            drawn = set(single.indices[step * whole:(step + 1) * whole])
            if union != drawn:
                return (f"at step {step + 1} of training pass {number + 1} the {nproc} ranks drew {len(union)} samples"
                        f" and the one process {len(drawn)}, {len(union & drawn)} of them the same: the one process"
                        " did not train on the ranks' global batch"), False
            compared += 1
    if not compared:
        return "not compared (the loader's indices were not recorded)", None
    return (f"at each of the {compared} steps compared the one process drew the union of the ranks' samples (of"
            f" {ran} steps in {passes} pass{'es' if passes > 1 else ''}: the last step of each pass is left out, a"
            " DistributedSampler pads it)"), True


def _compare_reasons(record, single_record, ranks_params, one_params, names, nproc, steps, torch) -> list[str]:
    reasons = []
    rates = [next((e.get("first_lrs") for e in r.events[min(r.events)] if e["event"] == "exit"), None)
             for r in (record, single_record)]
    if rates[0] and rates[1] and len(rates[0]) == len(rates[1]) and any(
            a and b and any(abs(x - y) > 1e-12 * max(abs(x), abs(y), 1e-30) for x, y in zip(a, b))
            for a, b in zip(*rates)):
        shown = [", ".join(f"{x:g}" for x in (lrs or [])) for lrs in (rates[0][0], rates[1][0])]
        reasons.append(f"compare: why: the learning rates differ: {shown[0]} on the {nproc} ranks, {shown[1]} in one"
                       " process (at the first step): the script sets the learning rate from the world size (a"
                       " learning rate scaled with the global batch, lessons 04 and 13b), so the two runs train"
                       " with other steps by design; to compare, give both the same learning rate")
    if steps[0] != steps[1]:
        reasons.append(f"compare: why: {steps[0]} optimizer steps on the ranks, {steps[1]} in one process: the"
                       " ranks don't split the data, or the step count depends on the world size")
    starts = [n for n in names if f"start.{n}" in ranks_params and f"start.{n}" in one_params]
    if starts and any(not torch.equal(ranks_params[f"start.{n}"], one_params[f"start.{n}"]) for n in starts):
        reasons.append("compare: why: the model starts from other weights on rank 0 than in one process: its weights"
                       " are drawn before any seed (each run draws its own), or from a seed that depends on the rank"
                       " or the world size. Seed once, the same everywhere, before making the model")
    elif starts and all(f"first.{n}" in ranks_params and f"first.{n}" in one_params for n in starts):
        # The first step alone: from the same weights, its size is the gradient's (times the learning rate).
        moved_ranks = sum((ranks_params[f"first.{n}"] - ranks_params[f"start.{n}"]).abs().sum().item() for n in starts)
        moved_one = sum((one_params[f"first.{n}"] - one_params[f"start.{n}"]).abs().sum().item() for n in starts)
        if moved_ranks > 0 and abs(moved_one / moved_ranks - nproc) < 0.1 * nproc:
            reasons.append(f"compare: why: one process's first step moved the weights {moved_one / moved_ranks:.2f}"
                           f" times as far as the {nproc} ranks' first step: a loss summed over the batch (DDP"
                           " averages the ranks' gradients, so each rank's sum counts 1/N): divide the sum by the"
                           " global batch size, or use the mean")
    return reasons


