"""The doctor's rules about the process group and the model: no group at all, separate models, parameters that
diverged, collectives that differ between ranks, the same random state everywhere, the rank from LOCAL_RANK, a group
never destroyed. Registered in RULES, below, with the codes each decides and the events it reads."""

from __future__ import annotations

from .doctor_record import Facts, Record, _first, _in_a_library
from .doctor_report import Finding, Rule

PARAMS_ATOL = 1e-6  # float32 all-reduced gradients give the ranks the same bits; any drift is a real difference


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


def _collectives_differ(events: dict[int, list[dict]], crashed: bool, failed=frozenset()) -> list[Finding]:
    """The first call at which the ranks' collectives part. When one side's call sits in an `if` that the other
    side went past (another call at that place, or more training since), the branch is named (collective-in-branch);
    otherwise the calls are (collectives-differ). A rank that made fewer calls because its own error ended it is the
    crash, not a mismatch."""
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
        fewer = place is None
        if fewer:
            place = min(len(reference), len(sequence))
            short = rank if len(sequence) < len(reference) else reference_rank
            if crashed and short in failed:
                continue  # one rank made fewer calls because it crashed: that is the crash, not a mismatch
        branch = _branch(events, {reference_rank: reference, rank: sequence}, place)
        if branch:
            return [branch]
        if fewer and crashed:
            continue  # cut short by the launch's end, with nothing to show that a rank went another way

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


def _branch(events, calls: dict[int, list], place: int) -> Finding | None:
    """collective-in-branch: rank A's call #PLACE is inside an `if` of the script, and rank B went past that
    point without it: it made another call there, outside that `if`, or made none and went on drawing batches (more
    than A had drawn when it called). The condition read a value that differs between ranks."""
    sides = sorted(calls.items(), key=lambda item: len(item[1]) <= place)  # a rank with a call there first
    if place < len(sides[1][1]):  # both called something there: the branch may be either one's
        return _branch_of(events, *sides, place) or _branch_of(events, *sides[::-1], place)
    return _branch_of(events, *sides, place) if place < len(sides[0][1]) else None


def _branch_of(events, side_a, side_b, place: int) -> Finding | None:
    """collective-in-branch for rank A's call #PLACE, against rank B."""
    (a, seq_a), (b, seq_b) = side_a, side_b
    mine = seq_a[place]
    if place < len(seq_b):
        went_on = f"called {seq_b[place]['op']} at {seq_b[place]['site']} instead"
        other_line = seq_b[place]["site"]
    else:
        def batches(evs):
            return sum(e["event"] == "batch" for e in evs)
        before = batches(events[a][:next(i for i, e in enumerate(events[a]) if e is mine)])
        if batches(events[b]) <= before:
            return None  # no sign that it went past: cut short, or slower
        went_on = (f"made no call #{place + 1} and went on: it drew {batches(events[b]) - before} more batch(es)"
                   f" than rank {a} had when it called")
        other_line = None
    found = _enclosing_if(mine["site"], other_line)
    if found is None:
        return None
    conditions, if_site = found
    one = len(conditions) == 1
    return Finding("collective-in-branch", (
        f"rank {a} entered {' and '.join(conditions)} and called {mine['op']} at {mine['site']} (its collective"
        f" #{place + 1}); rank {b} {went_on}: {'the condition' if one else 'one of the conditions'} read a value that"
        " differs between ranks (a rank's own metric, loss or rank), so one rank waits at a collective the others"
        " never reach: a hang, or a crash when a later collective meets it. Decide from a value every rank shares:"
        " all-reduce the metric (or decide on rank 0 and broadcast the decision), then take the branch together; or"
        " keep the collective out of the branch (lessons 11 and 13b)"), if_site)


def _enclosing_if(site: str, other: str | None) -> tuple[list, str] | None:
    """(the conditions, as ["`if A:` at :12", "`if B:` at :15"], and the outermost one's file:line) of the `if`s
    of the script around SITE's line, in its function, that do not also hold OTHER's line in the same arm (the call
    the other rank made instead), read from the script's file; None without one."""
    import ast
    from pathlib import Path

    path, _, line = site.rpartition(":")
    if not line.isdigit() or _in_a_library(site):
        return None
    try:
        source = Path(path).read_text()
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return None
    other_line = int(other.rpartition(":")[2]) if other and other.rpartition(":")[0] == path \
        and other.rpartition(":")[2].isdigit() else None

    def inside(node, n):
        return node.lineno <= n <= (node.end_lineno or node.lineno)

    def in_branch(node, n):  # in its body or its else, not in its test
        return any(inside(child, n) for child in node.body + node.orelse)

    around = []  # the `if`s around the call, outermost first, in the call's function (the other rank's not)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and inside(node, int(line)):
            around = [n for n in around if n.lineno > node.lineno]
        if isinstance(node, ast.If) and in_branch(node, int(line)) and not (
                other_line is not None and in_branch(node, other_line) and (
                    any(inside(c, other_line) for c in node.body) == any(inside(c, int(line)) for c in node.body))):
            around.append(node)
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and inside(n, int(line))]
    start = max((n.lineno for n in functions), default=0)
    around = sorted((n for n in around if n.lineno > start), key=lambda n: n.lineno)
    if not around:
        return None
    shown = [f"`if {ast.get_source_segment(source, n.test) or ast.unparse(n.test)}:` at :{n.lineno}" for n in around]
    return shown, f"{path}:{around[0].lineno}"


def _shape_text(shape) -> str:
    if shape and isinstance(shape[0], list) and len(shape) == 2 and isinstance(shape[1], str):
        return f"a {shape[1]} tensor of shape {tuple(shape[0])}"
    return f"{len(shape)} tensors"


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


RULES = [
    Rule(("not-distributed",), ("init", "optimizer", "loader"), _not_distributed, alone=True),
    Rule(("separate-models", "params-diverged"), ("wrapper", "init", "optimizer", "collective", "load", "exit"),
         lambda f: _separate_models(f.record)),
    Rule(("collectives-differ", "collective-in-branch"), ("collective", "batch", "pass", "pass_end", "exit"),
         lambda f: _collectives_differ(f.events, f.crashed, f.failed)),
    Rule(("same-random-state",), ("exit", "wrapper", "optimizer"), lambda f: _same_random_state(f.events, f.nproc)),
    Rule(("rank-from-local-rank",), ("init",), lambda f: _rank_from_local_rank(f.events)),
    Rule(("no-destroy",), ("exit", "init"), _no_destroy),
]
