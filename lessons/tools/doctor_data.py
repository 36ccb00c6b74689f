"""The doctor's rules about data: what the ranks drew from their loaders, pass by pass (unequal batches, the same
samples, data sets that differ, one order every epoch, padded or unreduced evaluations). Decided from the indices
drawn, not from a sampler's class. Registered in RULES, below."""

from __future__ import annotations

import math

from .doctor_report import Finding, Rule

SAME_SAMPLES = 0.5  # ranks sharing more than half their samples in a pass: no sharding, not a padded shard
DATA_EVENTS = ("sampler", "loader", "pass", "batch", "pass_end")


def _unequal_batches(trained: dict[int, dict], passes, events, failed=frozenset()) -> list[Finding]:
    keys = sorted({k for ps in trained.values() for k in ps}, key=lambda k: (k[0], k[1]))
    exits = {rank: next((e for e in evs if e["event"] == "exit"), None) for rank, evs in events.items()}
    # A rank that left the training loop and reached its exit while the rank that failed went on to another pass
    # over the training loader: a decision to stop taken on one rank.
    for site in sorted({k[0] for k in keys}):
        count = {rank: sum(p.loader["site"] == site for p in ps) for rank, ps in passes.items()}
        for gone in sorted(failed):
            for rank in sorted(count):
                if rank not in failed and exits.get(rank) and count[rank] < count.get(gone, 0):
                    return [Finding("unequal-batches", (
                        f"rank {rank} left the training loop after {count[rank]} pass(es) over the loader made here"
                        f" ({exits[rank]['steps']} steps) and went on to its exit, while rank {gone} began pass"
                        f" {count[rank] + 1} and failed there: its next collective waited for rank {rank}, which had"
                        " gone. A decision to stop (early stopping, a time limit, a NaN) taken on one rank must"
                        " reach every rank: all-reduce it, then stop together (lesson 13b)"), site)]
    for key in keys:
        have = {rank: ps[key] for rank, ps in trained.items() if key in ps and not ps[key].joined}
        done = {rank: p.batches for rank, p in have.items() if p.ended}
        for short, n in sorted(done.items(), key=lambda item: item[1]):
            longer = [(rank, p.batches) for rank, p in have.items() if p.batches > n]
            if longer:
                rank, m = longer[0]
                return [Finding("unequal-batches", (
                    f"rank {short} drew {n} batches in training pass {key[1]} of the loader made here, rank {rank}"
                    f" {'drew ' + str(m) if have[rank].ended else 'was still drawing at batch ' + str(m)}: in"
                    f" batch {n + 1} rank {rank}'s all-reduce waits for rank {short}, which has stopped: a hang"
                    " until the collective's timeout, or a crash when it exits. Give every rank as many batches: a"
                    " DistributedSampler (it pads the shards to one length), drop_last=True, or"
                    " torch.distributed.algorithms.Join (lesson 11b)"), key[0])]
    return []


def _seeded_per_rank(samplers) -> list[Finding]:
    """A shuffling DistributedSampler made at one site with another seed on each rank: the shards overlap."""
    by_site = {}
    for rank, made in sorted(samplers.items()):
        for sampler in made.values():
            by_site.setdefault(sampler["site"], {}).setdefault(rank, sampler)
    for site, per_rank in by_site.items():
        seeds = {rank: sampler["seed"] for rank, sampler in per_rank.items() if sampler["shuffle"]}
        if len(set(seeds.values())) > 1:
            shown = ", ".join(f"rank {rank} seed={seed}" for rank, seed in list(seeds.items())[:3])
            return [Finding("same-samples", (
                f"this DistributedSampler(shuffle=True) has another seed on each rank ({shown}): each rank shuffles"
                " its own permutation and takes its shard of that, so the shards overlap: an epoch trains some"
                " samples twice and leaves others out. Give every rank the same seed (the default, 0), and change"
                " the order each epoch with set_epoch (lesson 05)"), site)]
    return []


def _same_samples(trained, samplers, nproc, events) -> list[Finding]:
    seeded = _seeded_per_rank(samplers)
    if seeded or len(trained) < 2:
        return seeded
    exits = [next((e for e in evs if e["event"] == "exit"), None) for evs in events.values()]
    own_random = all(e and e.get("rng_per_step") for e in exits) and \
        len({e.get("rng_first_step") for e in exits}) == len(exits)  # each rank draws its own random numbers
    reference_rank = min(trained)
    for key, p in trained[reference_rank].items():
        if p.indices is None:
            continue
        # A pass of more than one epoch (an endless sampler; a sampler of the script's own that yields several
        # epochs): it draws more than the data set holds, or one sample twice. It is judged on each rank's first
        # share of one epoch: over many epochs any two ranks' draws cover the whole set, sharded or not. Sharded,
        # those shares are apart; drawn independently at random they overlap by 1/N: a finding needs more than
        # halfway from that to all of it.
        length = p.loader["length"]
        endless = bool(length) and (len(p.indices) > length or len(set(p.indices)) < len(p.indices))
        window = -(-length // nproc) if endless else None
        limit = (1 + 1 / nproc) / 2 if endless else SAME_SAMPLES
        mine = set(p.indices[:window])
        drawn_here = len(p.indices[:window])
        if length and len(mine) < 0.1 * length * (1 - math.exp(-drawn_here / length)):
            # Far fewer samples than even draws at random with replacement would give (an endless sampler that
            # yields indices 0 and 1 to a data set that makes each sample itself, at random): the indices name no
            # samples, and say nothing of what each rank trained on.
            continue
        for rank, ps in sorted(trained.items()):
            other = ps.get(key)
            if rank == reference_rank or other is None or other.indices is None or \
                    other.loader["dataset"] != p.loader["dataset"] or not mine or not other.indices:
                continue
            theirs = set(other.indices[:window])
            shared = len(mine & theirs) / min(len(mine), len(theirs))
            if shared <= limit:
                continue
            sampler = samplers[reference_rank].get(p.loader["sampler"])
            how = f"ranks {reference_rank} and {rank} drew {shared:.0%} of their samples in common in training" \
                  f" pass {key[1]}" + (f" (its first {window} draws a rank, one epoch's share)" if endless else "")
            length, drawn = p.loader["length"], len(p.indices)
            share = -(-length // nproc) if length else None
            whole = p.ended and length and 0.9 * length <= drawn <= length
            if sampler is None and p.ended and share and drawn <= share + (p.loader["batch_size"] or 0) \
                    and own_random:
                # Each rank draws its share, so the steps are a sharded epoch's, and the ranks draw their own random
                # numbers: repeated augmentation (DeiT's RASampler), each sample augmented otherwise on each rank.
                continue
            if sampler is None and whole:
                why = (f"the loader made here has no DistributedSampler ({p.loader['sampler_type']}): each rank drew"
                       f" {drawn} of the data set's {length} samples in the pass, so an epoch is {nproc} passes over"
                       f" the data: {nproc} times the steps of a sharded epoch ({-(-drawn // max(p.batches, 1))} a"
                       " batch). Give it sampler=DistributedSampler(dataset) and drop shuffle=True (lesson 05)")
            elif sampler is None:
                why = (f"its sampler ({p.loader['sampler_type']}) draws the same samples on every rank"
                       f"{'' if own_random else ' with the same random numbers'}: {drawn} samples drawn per rank"
                       f"{f' of {length}' if length else ''}, so the global batch holds copies of a sample and an"
                       " epoch covers less of the data than its steps suggest. Give every rank its own share: a"
                       " DistributedSampler, or the sampler's own num_replicas and rank (lesson 05)")
            elif sampler["num_replicas"] != nproc:
                why = (f"its DistributedSampler (made at {sampler['site']}) was given num_replicas="
                       f"{sampler['num_replicas']} in a world of {nproc}: leave num_replicas and rank out, and the"
                       " sampler takes them from the process group (lesson 05)")
            elif samplers[rank].get(other.loader["sampler"], {}).get("rank") == sampler["rank"]:
                why = (f"its DistributedSampler (made at {sampler['site']}) has rank={sampler['rank']} on more than"
                       " one rank: leave rank out, or pass dist.get_rank() (lesson 05)")
            else:
                why = (f"its DistributedSampler (made at {sampler['site']}) gives the ranks overlapping shards: give"
                       " every rank the same data set, num_replicas and seed, and its own rank (lesson 05)")
            return [Finding("same-samples", f"{how}: {why}", p.loader["site"])]
    return []


def _datasets_differ(events) -> list[Finding]:
    seen = {}  # site -> {rank: fingerprint}, for the loaders with a DistributedSampler
    for rank, evs in events.items():
        samplers = {e["sampler"] for e in evs if e["event"] == "sampler"}
        for e in evs:
            if e["event"] == "loader" and e["sampler"] in samplers:
                seen.setdefault(e["site"], {}).setdefault(rank, e["dataset"])
    for site, prints in seen.items():
        if len(set(prints.values())) > 1:
            return [Finding("datasets-differ", (
                "the data set behind this loader differs between ranks (an unseeded random_split, or data drawn"
                " at random on each rank), so its DistributedSampler gives each rank a shard of a different data"
                " set: some samples are trained twice, some never, and test samples can leak into training. Make"
                " it the same everywhere: random_split(..., generator=torch.Generator().manual_seed(0)) (lesson 05)"),
                site)]
    return []


def _sampler_epochs(passes, samplers) -> list[Finding]:
    """Two training passes of a shuffling DistributedSampler at the same epoch: the same order twice."""
    for rank in sorted(passes):
        seen = {}  # (sampler site, seed, epoch) -> sampler id
        for p in passes[rank]:
            sampler = samplers[rank].get(p.loader["sampler"])
            if not p.trained or sampler is None or not sampler["shuffle"] or p.epoch is None:
                continue
            key = (sampler["site"], sampler["dataset"], sampler["seed"], p.epoch)
            if key not in seen:
                seen[key] = sampler["sampler"]
            elif seen[key] == sampler["sampler"]:
                return [Finding("no-set-epoch", (
                    f"this DistributedSampler(shuffle=True) fed two training passes at the same epoch ({p.epoch}):"
                    " call sampler.set_epoch(epoch) before each epoch, or every epoch sees the same order (lesson"
                    " 05)"), sampler["site"])]
            else:
                return [Finding("sampler-recreated", (
                    f"a new DistributedSampler is made here for each epoch, each at epoch {p.epoch}: every epoch"
                    " shuffles into the same order. Make it once, before the epochs, and call"
                    " sampler.set_epoch(epoch) (lesson 05)"), sampler["site"])]
    return []


CARRY_DATA = {"all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
              "all_to_all", "all_to_all_single", "gather", "all_gather_object", "gather_object"}  # not a barrier,
# nor a broadcast (one rank's value sent to all: it shares a decision, it combines nothing)


def _evaluations(passes, samplers, nproc, events) -> list[Finding]:
    """Passes with no optimizer step (evaluations), matched between ranks by their loader's site and their order
    there, judged by what the ranks drew, each index taken through the loader's Subsets to the data set beneath:
    shares (each rank its part of one set, whatever made them: a DistributedSampler, a Subset per rank, a sampler of
    the script's own), padding (a sample in two ranks' shares, or twice in one), and whether a collective that
    carries data combined the shares before training went on. Without the indices, a DistributedSampler that pads
    (len(data) not a multiple of the ranks)."""
    if nproc < 2:
        return []
    found = []
    evaluations = {}  # (site, k) -> {rank: pass}
    for rank, ps in sorted(passes.items()):
        seen = {}
        for p in ps:
            if p.trained or not p.batches:
                continue
            k = seen[p.loader["site"]] = seen.get(p.loader["site"], 0) + 1
            evaluations.setdefault((p.loader["site"], k), {})[rank] = p
    training = {rank: {(p.loader["loader"], p.number) for p in ps if p.trained} for rank, ps in passes.items()}
    for (site, k), by_rank in evaluations.items():
        first_rank = min(by_rank)
        drawn = {rank: _beneath(p) for rank, p in by_rank.items() if p.ended and _beneath(p) is not None}
        sets = {rank: set(d) for rank, d in drawn.items()}
        one_set = len({_base(p) for p in by_rank.values()}) == 1
        if len(drawn) == len(passes) and len({frozenset(x) for x in sets.values()}) > 1 and one_set:
            combined = _combined_after(events[first_rank], by_rank[first_rank], training[first_rank])
            if not combined and not any(f.code == "unreduced-evaluation" for f in found):
                mine = len(drawn[first_rank])
                found.append(Finding("unreduced-evaluation", (
                    f"an evaluation pass (no optimizer step) in which each rank drew its own share of one data set"
                    f" ({mine} samples on rank {first_rank}, {len(set().union(*sets.values()))} on the {len(drawn)}"
                    " ranks together), and no collective that carries data (a reduction or a gather: not a barrier)"
                    " combined the ranks' results before training went on: each rank's metric, and any decision"
                    " taken from it (the best checkpoint, early stopping), is its own share's. Sum the counts and"
                    " totals over the ranks (dist.all_reduce), or evaluate the whole set on one rank (lesson 05)"),
                    site))
                continue
            every = [i for d in drawn.values() for i in d]
            repeated = len(every) - len(set(every))
            # Reduced, or aggregates gathered and summed (a metric library's counts), the padding counts twice;
            # per-sample results gathered, the script can drop the padding (gather_for_metrics does): no claim.
            # Padding is a sampler's, over one data set on every rank: shares of Subsets that differ between ranks
            # and overlap (an unseeded random_split) are datasets-differ's.
            one_loader_set = len({p.loader["dataset"] for p in by_rank.values()}) == 1
            if combined & (REDUCTIONS | {"gather-aggregate"}) and repeated and one_loader_set \
                    and not any(f.code == "padded-evaluation" for f in found):
                length = by_rank[first_rank].loader["length"]
                of = f" of {length}" if length else ""
                found.append(Finding("padded-evaluation", (
                    f"an evaluation pass (no optimizer step) whose shares hold {repeated} sample(s) twice: the"
                    f" {len(drawn)} ranks drew {len(every)} indices{of}, {len(set(every))} of them different (shards"
                    " padded to one length), so a metric reduced over the ranks (a sum of counts, or a mean of the"
                    " ranks' means) counts those twice. Exact: evaluate on one rank, or count only each sample's"
                    " first appearance (lesson 05)"), site))
            continue
        if drawn:
            continue  # every rank the same samples (each evaluates all), or one rank alone: nothing padded
        p = by_rank[first_rank]
        sampler = samplers[first_rank].get(p.loader["sampler"])
        if sampler is None or sampler["drop_last"] or any(f.code == "padded-evaluation" for f in found):
            continue
        length, replicas = sampler["length"], sampler["num_replicas"]
        padded = -length % replicas
        if padded:
            found.append(Finding("padded-evaluation", (
                f"an evaluation pass (no optimizer step) over a DistributedSampler of {length} samples on"
                f" {replicas} ranks: it pads the shards to {(length + padded) // replicas} each by repeating"
                f" {padded} sample(s), so a metric reduced over the ranks (a sum of counts, or a mean of the ranks'"
                " means) counts them twice. Exact: evaluate on one rank, or count only each sample's first"
                " appearance (lesson 05)"), site))
    return found


REDUCTIONS = {"all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"}


def _base(p) -> str:
    """The data set a pass's indices name, beneath the loader's Subsets."""
    return p.loader.get("base_dataset") or p.loader["dataset"]


def _beneath(p) -> list | None:
    """The pass's indices as indices into the data set beneath the loader's Subsets (base_indices maps them)."""
    mapping = p.loader.get("base_indices")
    if p.indices is None or mapping is None:
        return p.indices
    return [mapping[i] if 0 <= i < len(mapping) else -1 - i for i in p.indices]


def _combined_after(events, p, training) -> set:
    """The collectives that carry data (CARRY_DATA) the script made from pass P's start, batch after batch (a
    metric all-reduced each batch) and after its last, until training went on: a training pass's next batch or
    start (TRAINING: its (loader, number) keys), an optimizer step, or the end. A loss all-reduced for the log in
    the next training step is after that, and combines nothing of the evaluation's."""
    mine = [i for i, e in enumerate(events) if e["event"] in ("pass", "batch", "pass_end")
            and e.get("loader") == p.loader["loader"] and e.get("number") == p.number]
    if not mine:
        return set()
    end = events[mine[-1]]
    per_sample = {n for n in [*(end.get("batch_sizes") or []), len(p.indices or [])] if n > 0}
    steps, ops = events[mine[-1]].get("steps", 0), set()
    for e in events[mine[0] + 1:]:
        if e["event"] in ("pass", "batch") and (e["loader"], e["number"]) in training:
            break
        if e.get("steps", steps) > steps:
            break
        if e["event"] == "collective" and e["op"] in CARRY_DATA:
            ops.add(_gathered_what(e, per_sample) if e["op"] in GATHERS else e["op"])
    return ops


GATHERS = {"all_gather", "all_gather_into_tensor", "gather"}


def _gathered_what(e, per_sample: set) -> str:
    """A gather of per-sample results (its tensors' first dimension a batch's or the pass's sample count: the
    script can drop the padding, as Accelerate's gather_for_metrics does) or of aggregates (counts, sums: a metric
    library's states, gathered and then summed, count the padding twice). Objects: per-sample, no claim."""
    shape = e.get("shape")
    if not shape:
        return "gather-per-sample"
    tensors = shape if isinstance(shape[0], list) and isinstance(shape[0][0], list) else [shape]  # a list's
    firsts = {dims[0] for dims, _ in tensors if dims}
    if e["op"] == "all_gather_into_tensor":
        firsts |= {n // max(len(tensors), 1) for n in firsts}
    return "gather-per-sample" if firsts & per_sample else "gather-aggregate"


RULES = [
    Rule(("unequal-batches",), DATA_EVENTS + ("exit",), lambda f: _unequal_batches(f.trained, f.passes, f.events,
                                                                                     f.failed)),
    Rule(("same-samples",), DATA_EVENTS + ("exit",), lambda f: _same_samples(f.trained, f.samplers, f.nproc,
                                                                               f.events)),
    Rule(("datasets-differ",), ("sampler", "loader"), lambda f: _datasets_differ(f.events)),
    Rule(("no-set-epoch", "sampler-recreated"), DATA_EVENTS, lambda f: _sampler_epochs(f.passes, f.samplers)),
    Rule(("padded-evaluation", "unreduced-evaluation"), DATA_EVENTS + ("collective",),
         lambda f: _evaluations(f.passes, f.samplers, f.nproc, f.events)),
]
