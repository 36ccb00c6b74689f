"""The DDP doctor's rules: what the ranks recorded (lessons/tools/doctor_events.py) turned into findings.

Each rule is registered in RULES with the codes it decides and the events it reads; the facts the rules share (each
rank's events, samplers, passes over loaders, exits, parameters) are built once, in Facts. CODES' order is the order
findings are printed in (by severity first). A new finding: CONTRIBUTING.md, "A new finding of the doctor".
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

@dataclass(frozen=True)
class Code:
    """A finding's stable code: how serious it is, and what it says in one phrase (lesson 14b's table says more)."""
    severity: int  # 1 the trained model is not the one intended; 2 a waste or a corrupted file; 3 a risk;
    what: str  # 4 a note: right here, wrong elsewhere or slightly off (the exit status stays 0)


# In the order the findings are listed: the most serious first, and within a severity as here.
CODES = {
    "not-distributed": Code(1, "the script never forms a process group: N copies of one process"),
    "separate-models": Code(1, "every rank trains a model of its own"),
    "collectives-differ": Code(1, "the ranks call other collectives, or other shapes, at the same point"),
    "unequal-batches": Code(1, "the ranks train different numbers of batches"),
    "same-samples": Code(1, "the ranks train on the same samples"),
    "datasets-differ": Code(1, "the ranks' loaders read different data sets"),
    "params-diverged": Code(1, "the ranks end with different parameters"),
    "same-random-state": Code(1, "every rank draws the same dropout masks in its steps"),
    "no-set-epoch": Code(1, "a shuffling DistributedSampler feeds every epoch the same order"),
    "sampler-recreated": Code(1, "a new DistributedSampler each epoch restarts the order"),
    "rank-from-local-rank": Code(1, "the global rank is taken from LOCAL_RANK"),
    "save-on-every-rank": Code(2, "every rank writes the same checkpoint"),
    "load-without-map-location": Code(3, "a load puts every rank's tensors where they were saved from"),
    "map-location-maps-nothing": Code(3, "a map_location that maps no device the file holds"),
    "weights-only-off": Code(3, "torch.load(weights_only=False) runs code from the file"),
    "no-destroy": Code(3, "the process group is never destroyed"),
    "padded-evaluation": Code(4, "an evaluation over padded shards counts some samples twice"),
    "unreduced-evaluation": Code(4, "an evaluation over shards that no collective combines: each rank's own share"),
    "map-location-on-gpus": Code(4, "a load without map_location: right on the CPU, one GPU for all on GPUs"),
    "device-from-global-rank": Code(4, "the GPU is chosen by the global rank: right on one node only"),
}
NOTE = 4
PARAMS_ATOL = 1e-6  # float32 all-reduced gradients give the ranks the same bits; any drift is a real difference
SAME_SAMPLES = 0.5  # ranks sharing more than half their samples in a pass: no sharding, not a padded shard


@dataclass
class Finding:
    code: str
    message: str
    site: str | None = None  # file:line where it shows

    def __str__(self):
        return f"{self.code}: {self.site + ': ' if self.site else ''}{self.message}"


@dataclass
class Record:
    """What the ranks wrote: their events, and their parameters at exit."""
    events: dict[int, list[dict]]
    params: dict[int, dict]
    errors: dict[int, str]  # the instruments' own failures, by rank


# --- Reading the events ------------------------------------------------------------------------------------------

@dataclass
class Pass:
    """One pass over a loader on one rank: an iteration of it, from iter() to StopIteration or abandonment."""
    loader: dict  # the loader event
    number: int
    epoch: int | None
    batches: int = 0
    ended: bool = False
    trained: bool = False  # the optimizer stepped between its batches
    joined: bool = False  # inside a Join context: uneven batches are handled
    indices: list | None = None


def passes_of(events: list[dict]) -> list[Pass]:
    """Every pass of a rank, in order, each marked trained when an optimizer step fell inside it."""
    loaders = {e["loader"]: e for e in events if e["event"] == "loader"}
    passes, current, last_steps = {}, None, 0
    for e in events:
        if "steps" in e:
            if e["steps"] > last_steps and current is not None:
                current.trained = True
            last_steps = e["steps"]
        if e["event"] == "pass" and e["loader"] in loaders:
            passes[(e["loader"], e["number"])] = Pass(loaders[e["loader"]], e["number"], e.get("epoch"),
                                                      joined=bool(e.get("joined")))
        elif e["event"] in ("batch", "pass_end") and (e["loader"], e["number"]) in passes:
            p = passes[(e["loader"], e["number"])]
            if e["event"] == "batch":
                p.batches, current = e["n"], p
            else:  # a pass left before its end keeps the samples it drew, not a count to compare
                p.batches, p.ended, p.indices = e["batches"], e.get("complete", True), e.get("indices")
    return list(passes.values())


def by_site(passes: list[Pass]) -> dict[tuple[str, int], Pass]:
    """The k-th training pass of the loaders made at each site: what matches between ranks."""
    keyed, counts = {}, {}
    for p in passes:
        if p.trained:
            k = counts[p.loader["site"]] = counts.get(p.loader["site"], 0) + 1
            keyed[(p.loader["site"], k)] = p
    return keyed


@dataclass
class Facts:
    """What the rules share, built once from a record: each rank's events, samplers (by id), passes over loaders,
    training passes by (site, k), and exit event; the run's size and how it ended."""
    record: Record
    nproc: int
    crashed: bool = False
    failed: set = field(default_factory=set)  # the ranks whose own error ended the launch, when known

    def __post_init__(self):
        self.events = self.record.events
        self.samplers = {rank: {e["sampler"]: e for e in evs if e["event"] == "sampler"}
                         for rank, evs in self.events.items()}
        self.passes = {rank: passes_of(evs) for rank, evs in self.events.items()}
        self.trained = {rank: by_site(ps) for rank, ps in self.passes.items()}
        self.exits = {rank: next((e for e in evs if e["event"] == "exit"), None) for rank, evs in self.events.items()}


@dataclass(frozen=True)
class Rule:
    """A rule: the codes it decides, the events it reads (each described in lessons/tools/doctor_events.py), and
    the decision, from the facts. alone: when it fires, the other rules are not asked (a run that never formed a
    group has nothing else to judge)."""
    codes: tuple
    reads: tuple
    decide: Callable
    alone: bool = False


def _not_distributed(facts: Facts) -> list[Finding]:
    events = facts.events
    if facts.nproc > 1 and not facts.crashed and all(evs for evs in events.values()) \
            and not any(e["event"] == "init" for evs in events.values() for e in evs):
        made = _first(events, "optimizer") or _first(events, "loader")
        return [Finding("not-distributed", (
            f"no rank called init_process_group: the {facts.nproc} processes torchrun started each ran the whole"
            " one-process script: each trains its own model on all the data, and each writes the same files."
            " Make it distributed first: the five changes of lesson 00, or ddp_scripts/template.py"),
            made["site"] if made else None)]
    return []


def _no_destroy(facts: Facts) -> list[Finding]:
    if facts.crashed:
        return []
    undestroyed = [rank for rank, e in facts.exits.items() if e and e["initialized"]]
    # Lightning and Accelerate make the group, and tear it down as they see fit (Lightning leaves a gloo group to the
    # interpreter's exit): the script has no line to change.
    by_library = any(_in_a_library(e["site"]) for evs in facts.events.values() for e in evs if e["event"] == "init")
    if undestroyed and all(facts.exits.values()) and not by_library:
        return [Finding("no-destroy", (
            f"rank(s) {', '.join(map(str, undestroyed))} exited with the process group never destroyed; end with"
            " dist.destroy_process_group(), or the exit can hang or abort (lesson 00)"))]
    return []


DATA_EVENTS = ("sampler", "loader", "pass", "batch", "pass_end")
RULES = [  # in any order: the findings are sorted by CODES
    Rule(("not-distributed",), ("init", "optimizer", "loader"), _not_distributed, alone=True),
    Rule(("separate-models", "params-diverged"), ("wrapper", "init", "optimizer", "collective", "load", "exit"),
         lambda f: _separate_models(f.record)),
    Rule(("collectives-differ",), ("collective",), lambda f: _collectives_differ(f.events, f.crashed)),
    Rule(("unequal-batches",), DATA_EVENTS + ("exit",), lambda f: _unequal_batches(f.trained, f.passes, f.events,
                                                                                     f.failed)),
    Rule(("same-samples",), DATA_EVENTS + ("exit",), lambda f: _same_samples(f.trained, f.samplers, f.nproc,
                                                                               f.events)),
    Rule(("datasets-differ",), ("sampler", "loader"), lambda f: _datasets_differ(f.events)),
    Rule(("no-set-epoch", "sampler-recreated"), DATA_EVENTS, lambda f: _sampler_epochs(f.passes, f.samplers)),
    Rule(("same-random-state",), ("exit", "wrapper", "optimizer"), lambda f: _same_random_state(f.events, f.nproc)),
    Rule(("rank-from-local-rank",), ("init",), lambda f: _rank_from_local_rank(f.events)),
    Rule(("save-on-every-rank", "load-without-map-location", "map-location-maps-nothing", "weights-only-off",
          "map-location-on-gpus"), ("init", "save", "load"), lambda f: _saves_and_loads(f.events, f.nproc)),
    Rule(("padded-evaluation", "unreduced-evaluation"), DATA_EVENTS + ("collective",),
         lambda f: _evaluations(f.passes, f.samplers, f.nproc, f.events)),
    Rule(("no-destroy",), ("exit", "init"), _no_destroy),
]


def examine_record(record: Record, nproc: int, crashed: bool = False, failed: set[int] = frozenset()) -> list[Finding]:
    """The findings in what NPROC ranks recorded, most serious first; crashed: the launch failed (FAILED: the ranks
    whose own error it was, when known)."""
    facts = Facts(record, nproc, crashed, set(failed))
    found = []
    for rule in RULES:
        decided = rule.decide(facts)
        if decided and rule.alone:
            return decided
        found += decided
    order = list(CODES)
    return sorted(found, key=lambda f: (CODES[f.code].severity, order.index(f.code)))


def _evaluations(passes, samplers, nproc, events) -> list[Finding]:
    """Passes with no optimizer step (evaluations), matched between ranks by their loader's site and their order
    there, judged by what the ranks drew: shares (each rank its part of the data set), padding (a sample in two
    ranks' shares, or twice in one), and whether the script then combined the shares with a collective before its
    next step. Without the indices, a DistributedSampler that pads (len(data) not a multiple of the ranks)."""
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
    for (site, k), by_rank in evaluations.items():
        first_rank = min(by_rank)
        drawn = {rank: p.indices for rank, p in by_rank.items() if p.indices is not None and p.ended}
        sets = {rank: set(d) for rank, d in drawn.items()}
        if len(drawn) == len(passes) and len({frozenset(x) for x in sets.values()}) > 1 \
                and len({p.loader["dataset"] for p in by_rank.values()}) == 1:  # shares of one data set
            combined = _collective_after(events[first_rank], by_rank[first_rank])
            if not combined and not any(f.code == "unreduced-evaluation" for f in found):
                mine = len(drawn[first_rank])
                found.append(Finding("unreduced-evaluation", (
                    f"an evaluation pass (no optimizer step) in which each rank drew its own share ({mine} samples on"
                    f" rank {first_rank}, {len(set().union(*sets.values()))} on the {len(drawn)} ranks together),"
                    " and no collective of the script combined the ranks' results before the next step: what rank 0"
                    " reports is its own share's metric. Sum the counts and totals over the ranks (dist.all_reduce),"
                    " or evaluate the whole set on one rank (lesson 05)"), site))
                continue
            every = [i for d in drawn.values() for i in d]
            repeated = len(every) - len(set(every))
            summed = combined & {"all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"}
            # Summed, the padding counts twice; gathered, the script holds each sample's result and can drop the
            # padding (Accelerate's gather_for_metrics does): no claim.
            if summed and repeated and not any(f.code == "padded-evaluation" for f in found):
                length = by_rank[first_rank].loader["length"]
                of = f" of {length}" if length else ""
                found.append(Finding("padded-evaluation", (
                    f"an evaluation pass (no optimizer step) whose shares hold {repeated} sample(s) twice: the"
                    f" {len(drawn)} ranks drew {len(every)} indices{of}, {len(set(every))} of them different (shards"
                    " padded to one length), so a metric summed over the ranks counts those twice. Exact: evaluate"
                    " on one rank, or count only each sample's first appearance (lesson 05)"), site))
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
                f" {padded} sample(s), so a metric summed over the ranks counts them twice. Exact: evaluate"
                " on one rank, or count only each sample's first appearance (lesson 05)"), site))
    return found


def _collective_after(events, p) -> set:
    """The collectives (their ops) the script made after pass P's last batch, before the next optimizer step (or the
    end): how the ranks' shares were combined, if at all."""
    last = max((i for i, e in enumerate(events) if e["event"] in ("batch", "pass_end")
                and e.get("loader") == p.loader["loader"] and e.get("number") == p.number), default=None)
    if last is None:
        return set()
    steps, ops = events[last].get("steps", 0), set()
    for e in events[last + 1:]:
        if e["event"] == "collective":
            ops.add(e["op"])
        if e.get("steps", steps) > steps:
            break
    return ops


def _device_from_global_rank(script) -> list[Finding]:  # STATIC, below
    """Read the script: a GPU picked by the global rank (dist.get_rank(), RANK) instead of LOCAL_RANK. On the CPU
    that branch never runs; on one node the two ranks agree; from the second node on, cuda:RANK doesn't exist."""
    import ast

    try:
        tree = ast.parse(Path(script).read_text())
    except (OSError, SyntaxError, ValueError):
        return []

    def text(node):
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None

    def names_rank(node, names=()):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "int" and node.args:
            return names_rank(node.args[0], names)
        if isinstance(node, ast.Call) and not node.args and not node.keywords and (
                isinstance(node.func, ast.Attribute) and node.func.attr == "get_rank" or
                isinstance(node.func, ast.Name) and node.func.id == "get_rank"):
            return True
        if isinstance(node, ast.Subscript) and text(node.slice) == "RANK":
            return True  # os.environ["RANK"]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "get", "getenv") and node.args and text(node.args[0]) == "RANK":
            return True
        return isinstance(node, ast.Name) and node.id in names

    assigned = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            assigned.setdefault(node.targets[0].id, []).append(node.value)
    parameters = {a.arg for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.Lambda))
                  for a in node.args.args + node.args.kwonlyargs}
    names = {name for name, values in assigned.items() if name not in parameters
             and all(names_rank(v) for v in values)}  # only ever the global rank

    def by_rank(node):
        return names_rank(node, names)

    for node in ast.walk(tree):
        chosen = None
        if isinstance(node, ast.Call):
            func = node.func
            attr = func.attr if isinstance(func, ast.Attribute) else None
            if attr == "set_device" and node.args and by_rank(node.args[0]):
                chosen = "torch.cuda.set_device"
            elif attr == "device" and len(node.args) == 2 and text(node.args[0]) == "cuda" and by_rank(node.args[1]):
                chosen = "torch.device('cuda', rank)"
            elif attr in ("cuda", "to") and len(node.args) == 1 and not node.keywords and by_rank(node.args[0]):
                chosen = f".{attr}(rank)"
            for keyword in node.keywords:
                if keyword.arg == "device_ids" and isinstance(keyword.value, (ast.List, ast.Tuple)) and \
                        any(by_rank(v) for v in keyword.value.elts):
                    chosen = "device_ids=[rank]"
        elif isinstance(node, ast.JoinedStr):
            parts = node.values
            for before, value in zip(parts, parts[1:]):
                if text(before) and text(before).endswith("cuda:") and isinstance(value, ast.FormattedValue) \
                        and by_rank(value.value):
                    chosen = "f'cuda:{rank}'"
        if chosen:
            return [Finding("device-from-global-rank", (
                f"{chosen} with the global rank: right on one node, where it equals LOCAL_RANK; from the second"
                " node on it names a GPU that machine doesn't have (invalid device ordinal). Choose the GPU by"
                " LOCAL_RANK: int(os.environ['LOCAL_RANK']) (lesson 10)"),
                f"{_shown_path(str(script))}:{node.lineno}")]
    return []


def _shown_path(name: str) -> str:
    """As the ranks show their sites (doctor_site/sitecustomize.py): relative to here unless that climbs 2 folders."""
    try:
        relative = os.path.relpath(name)
    except ValueError:
        return name
    return name if relative.startswith(os.path.join("..", "..")) else relative


def _first(events, kind):
    return next((e for evs in events.values() for e in evs if e["event"] == kind), None)


def _separate_models(record: Record) -> list[Finding]:
    """The ranks' parameters at exit, each optimizer's and each DDP module's, compared with rank 0's. Only a model's
    parameters are compared: the instruments name what each parameter is (doctor_site: "opt" a model's parameter;
    "flat" and "own", an FSDP shard or a tensor of the rank's own, are left out, as DTensors are)."""
    params = record.params
    stepped = [next((e["steps"] for e in evs if e["event"] == "exit"), 0) for evs in record.events.values()]
    if len(params) < 2 or not all(stepped):
        return []  # a rank that never stepped trained nothing: the weights it was given are no model of its own
    reference_rank = min(params)
    groups = {}  # "opt0" / "ddp0" -> {rank: {name: tensor}}
    for rank, tensors in params.items():
        for name, value in tensors.items():
            group = name.split(".", 1)[0]
            if group.startswith(("opt", "ddp")):
                groups.setdefault(group, {}).setdefault(rank, {})[name] = value
    worst = (0.0, None, None)
    for group, ranks in sorted(groups.items(), key=lambda item: not item[0].startswith("ddp")):
        shapes = {rank: {n: tuple(t.shape) for n, t in tensors.items()} for rank, tensors in ranks.items()}
        if len(ranks) < len(params) or any(s != shapes[reference_rank] for s in shapes.values()):
            continue  # other models on other ranks (pipeline stages): each rank holds its own part
        for rank, tensors in ranks.items():
            for name, value in tensors.items():
                diff = (value - ranks[reference_rank][name]).abs().max().item() if value.numel() else 0.0
                if diff > worst[0]:
                    worst = (diff, name, rank)
    diff, name, rank = worst
    wrapped = _first(record.events, "wrapper")
    optimizer = _first(record.events, "optimizer")
    if diff <= PARAMS_ATOL:
        if wrapped is None and _first(record.events, "init") is not None and groups:
            copied = _copied_after_training(record.events)
            if _parted_at_first_step(params):
                how = ("after their first step the ranks' weights already differed (each rank stepped on its own"
                       f" gradients); they agree at exit only because {copied or 'they were made equal afterwards'}")
            elif _trained_alone(record.events):
                how = ("the ranks make no collective while they train; their weights agree at exit only because "
                       + (copied or "every rank started from the same weights and trained on the same batches:"
                                    " N copies of one run"))
            else:
                return []
            return [Finding("separate-models", (
                f"every rank trains its own model: no DistributedDataParallel (or FSDP) wraps it, and {how}. Wrap"
                " the model, model = DDP(model), before making the optimizer (lesson 04)"),
                optimizer["site"] if optimizer else None)]
        return []
    if wrapped is None and _first(record.events, "init") is not None:
        return [Finding("separate-models", (
            f"every rank trains its own model: no DistributedDataParallel (or FSDP) wraps it, and at exit the"
            f" parameters differ between ranks by up to {diff:.3g} (rank {rank} vs rank {reference_rank})"
            f"{_what_they_shared(record.events)}: wrap the model, model = DDP(model), before making the"
            " optimizer (lesson 04)"), optimizer["site"] if optimizer else None)]
    return [Finding("params-diverged", (
        f"at exit the parameters differ between ranks: largest difference {diff:.3g} (rank {rank} vs rank"
        f" {reference_rank}, {_param_name(name)}); something changed the weights outside DDP's backward and the"
        " optimizer's step on some ranks only, or the ranks started from other weights (lesson 03)"),
        wrapped["site"] if wrapped else None)]


def _parted_at_first_step(params) -> bool:
    """The model's parameters after each rank's first optimizer step (two sums a tensor): not the same on every
    rank. Replicas kept in step (DDP, gradients averaged by hand) agree there, to float32's last bits."""
    import torch

    for group in {n.split(".", 1)[1] for tensors in params.values() for n in tensors if n.startswith("firstsum.")}:
        sums = [tensors.get(f"firstsum.{group}") for tensors in params.values()]
        if all(t is not None for t in sums) and any(t.shape != sums[0].shape or not torch.allclose(
                t, sums[0], rtol=1e-6, atol=1e-9) for t in sums):
            return True
    return False


def _what_they_shared(events) -> str:
    """What the ranks exchanged while training, in a separate-models finding's words."""
    during = [e for e in events[min(events)] if e["event"] == "collective" and e.get("steps", 0) > 0]
    if not during:
        return ". The ranks share nothing but the process group"
    ops = sorted({e["op"] for e in during})
    return (f". The ranks' {len(during)} collective(s) while training ({', '.join(ops)}, first at {during[0]['site']})"
            " did not keep their weights equal: each rank's optimizer steps on its own gradients")


def _copied_after_training(events) -> str | None:
    """A load or a broadcast after the last optimizer step: one rank's weights copied to all."""
    mine = events[min(events)]
    final = next((e["steps"] for e in mine if e["event"] == "exit"), 0)
    done = next((i for i, e in enumerate(mine) if e.get("steps") == final), len(mine))
    for e in mine[done:]:
        if e["event"] == "load" and e.get("site"):
            return f"rank 0's were loaded by every rank at {e['site']}"
        if e["event"] == "collective" and e["op"] == "broadcast":
            return f"one rank's were broadcast to all at {e['site']}"
    return None


def _trained_alone(events) -> bool:
    """Every rank stepped its optimizer more than once, with none of the script's collectives before its last step."""
    for evs in events.values():
        steps = next((e["steps"] for e in evs if e["event"] == "exit"), 0)
        if steps < 2 or any(e["event"] == "collective" and e.get("steps", steps) < steps for e in evs):
            return False
    return True


def _param_name(name: str) -> str:
    group, rest = name.split(".", 1)
    return f"parameter {rest}" if group.startswith("ddp") else f"the optimizer's parameter #{rest}"


def _collectives_differ(events: dict[int, list[dict]], crashed: bool) -> list[Finding]:
    calls = {rank: [e for e in evs if e["event"] == "collective"] for rank, evs in events.items()}
    if len(calls) < 2:
        return []
    reference_rank = min(calls)
    reference = calls[reference_rank]
    for rank, sequence in sorted(calls.items()):
        key = [(e["op"], e["shape"]) for e in sequence]
        if key == [(e["op"], e["shape"]) for e in reference]:
            continue
        place = next((i for i, (a, b) in enumerate(zip(reference, sequence)) if (a["op"], a["shape"]) !=
                      (b["op"], b["shape"])), None)
        if place is None:
            if crashed:
                continue  # one rank made fewer calls because it crashed: that is the crash, not a mismatch
            place = min(len(reference), len(sequence))

        def call(seq, r):
            if place >= len(seq):
                return f"rank {r} made no call #{place + 1} ({len(seq)} collectives in all)"
            shape = seq[place]["shape"]
            return f"rank {r} called {seq[place]['op']}" + (f" on {_shape_text(shape)}" if shape else "") + \
                f" at {seq[place]['site']}"

        site = (sequence if place < len(sequence) else reference)[place]["site"] if place < max(
            len(sequence), len(reference)) else None
        return [Finding("collectives-differ", (
            f"the ranks' collectives part at call #{place + 1}: {call(reference, reference_rank)}, "
            f"{call(sequence, rank)}; every rank must make the same collectives in the same order with the same"
            " shapes, or the job hangs or fails (lessons 11 and 11b)"), site)]
    return []


def _shape_text(shape) -> str:
    if shape and isinstance(shape[0], list) and len(shape) == 2 and isinstance(shape[1], str):
        return f"a {shape[1]} tensor of shape {tuple(shape[0])}"
    return f"{len(shape)} tensors"


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
        mine = set(p.indices)
        for rank, ps in sorted(trained.items()):
            other = ps.get(key)
            if rank == reference_rank or other is None or other.indices is None or \
                    other.loader["dataset"] != p.loader["dataset"] or not mine or not other.indices:
                continue
            shared = len(mine & set(other.indices)) / min(len(mine), len(set(other.indices)))
            if shared <= SAME_SAMPLES:
                continue
            sampler = samplers[reference_rank].get(p.loader["sampler"])
            how = f"ranks {reference_rank} and {rank} drew {shared:.0%} of their samples in common in training" \
                  f" pass {key[1]}"
            length, drawn = p.loader["length"], len(p.indices)
            share = -(-length // nproc) if length else None
            whole = p.ended and length and drawn >= 0.9 * length
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


def _same_random_state(events, nproc) -> list[Finding]:
    """Random numbers drawn during the steps (dropout, augmentation in the main process) from the same random state
    on every rank: the same masks everywhere, as if the global batch were N copies of one rank's noise."""
    exits = [next((e for e in evs if e["event"] == "exit"), None) for evs in events.values()]
    if nproc < 2 or len(exits) < 2 or not all(e and e.get("rng_per_step") for e in exits):
        return []
    if not any(e["event"] == "wrapper" and e.get("dropout") for evs in events.values() for e in evs):
        return []  # random numbers drawn alike on purpose (one random batch, then each rank's slice): no masks
    # The same state after the first step, or when its batch was drawn (batches of other shapes on the ranks draw
    # other counts of numbers from one state: the masks are the same, cut to other lengths)
    if not any(len(states) == 1 and None not in states for states in (
            {e.get("rng_first_step") for e in exits}, {e.get("rng_first_batch") for e in exits})):
        return []
    optimizer = _first(events, "optimizer")
    layer = next(e["dropout"] for evs in events.values() for e in evs if e["event"] == "wrapper" and e.get("dropout"))
    return [Finding("same-random-state", (
        f"the model has {layer}, and the script draws its random numbers during the steps from the same random state"
        " on every rank (one seed everywhere; on GPUs no seed too: CUDA's generator starts from one default seed in"
        " every process), so every rank draws the same dropout masks (and augmentations). Seed each rank differently"
        " after the model is made:"
        " torch.manual_seed(seed + rank) (lesson 05)"), optimizer["site"] if optimizer else None)]


def _rank_from_local_rank(events) -> list[Finding]:
    for rank, evs in sorted(events.items()):
        for e in evs:
            if e["event"] == "init" and e["rank_given"] is not None and e["rank_given"] != e["env_rank"]:
                return [Finding("rank-from-local-rank", (
                    f"init_process_group(rank={e['rank_given']}) on the process torchrun numbered RANK"
                    f" {e['env_rank']} (LOCAL_RANK {e['local_rank']}): the global rank is RANK; LOCAL_RANK numbers"
                    " the processes of one node and picks its GPU. On 2 nodes two processes then claim one rank:"
                    " leave rank out (init_process_group reads RANK), or pass int(os.environ['RANK']) (lesson 10)"),
                    e["site"])]
    return []


def _in_a_library(site: str | None) -> bool:
    return bool(site) and any(f"{os.sep}{folder}{os.sep}" in site for folder in ("site-packages", "dist-packages"))


def _saves_and_loads(events, nproc) -> list[Finding]:
    found = []
    local = {rank: next((e["local_rank"] for e in evs if e["event"] == "init"), None) for rank, evs in
             events.items()}
    savers = {}
    for rank, evs in sorted(events.items()):
        for e in evs:
            if e["event"] == "save":
                savers.setdefault(e["path"], {}).setdefault(rank, e["site"])
    for path, ranks in savers.items():
        if len(ranks) > 1:
            nodes = all(local[r] == 0 for r in ranks)  # several ranks with LOCAL_RANK 0: one per node
            who = f"ranks {', '.join(map(str, sorted(ranks)))}" + (" (LOCAL_RANK 0 of each node)" if nodes else "")
            found.append(Finding("save-on-every-rank", (
                f"{who} all called torch.save({path!r}): they write one file at once, and it can end up torn."
                " Save on the global rank 0 only (dist.get_rank() == 0, not LOCAL_RANK), then dist.barrier()"
                " (lesson 07)"), ranks[min(ranks)]))
    # A load in a library's own code (Accelerate's load_state) is not a line the script can change.
    loads = [(rank, e) for rank, evs in sorted(events.items()) for e in evs if e["event"] == "load"
             and not _in_a_library(e["site"])]
    if nproc > 1:
        for rank, e in loads:
            devices = [loc for loc in (e.get("saved_from") or []) if loc != "cpu"]
            if e["map_location"] is None and devices and set(savers.get(e["path"], {})) != {rank}:  # a rank's own
                # file (only it wrote it), saved from its own GPU, goes back there
                found.append(Finding("load-without-map-location", (
                    f"rank {rank}: torch.load({e['path']!r}) without map_location, of tensors saved from"
                    f" {', '.join(devices)}: every rank puts them back there, all on one GPU (its memory, and a"
                    " CUDA context of each rank on it). Pass map_location='cpu' or the rank's own device"
                    " (lesson 07)"), e["site"]))
                break
        for rank, e in loads:
            mapping = e["map_location"]["dict"] if isinstance(e["map_location"], dict) else None
            devices = [loc for loc in (e.get("saved_from") or []) if loc != "cpu"]
            if mapping is not None and (not mapping or devices and not set(devices) & set(mapping)):
                found.append(Finding("map-location-maps-nothing", (
                    f"rank {rank}: torch.load({e['path']!r}, map_location={mapping}) maps none of the locations the"
                    f" file's tensors were saved from ({', '.join(devices) or 'cpu'}): they load where they were"
                    " saved, as with no map_location. Pass the device itself: map_location='cpu', or"
                    " f'cuda:{local_rank}' (lesson 07)"), e["site"]))
                break
        for rank, e in loads:  # the same line on GPUs: a file saved from cuda:0 loads there on every rank
            if e["map_location"] is None and (e.get("saved_from") or []) == ["cpu"] and \
                    set(savers.get(e["path"], {})) != {rank}:
                found.append(Finding("map-location-on-gpus", (
                    f"rank {rank}: torch.load({e['path']!r}) without map_location: right here, where the file holds"
                    " CPU tensors; once the script runs on GPUs and saves from cuda:0, every rank loads the file"
                    " onto cuda:0. Pass map_location='cpu' or the rank's own device (lesson 07)"), e["site"]))
                break
    for rank, e in loads:
        if e["weights_only"] is False:
            found.append(Finding("weights-only-off", (
                f"rank {rank}: torch.load({e['path']!r}, weights_only=False) runs any code pickled in the file;"
                " save tensors and plain values, and load with weights_only=True (lesson 07)"), e["site"]))
            break
    return found




STATIC = Rule(("device-from-global-rank",), (), _device_from_global_rank)  # reads the script's text, not events
