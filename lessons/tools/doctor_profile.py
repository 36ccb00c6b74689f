"""The doctor's --profile: where each rank's step time goes, read from one torch.profiler trace per rank, and the
slowdowns it shows (lesson 06b).

    steps = read_traces(["trace/rank0.json", "trace/rank1.json"])   # {rank: [Step, ...]}, the profiled steps
    table = breakdown(steps)                                          # {rank: {"step": ms, "compute": ms, ...}}
    found, unsure = judge(steps, metas)                               # [Finding], most costly first; can't-judge lines

A step is one `ProfilerStep#k` span of the thread that called `profiler.step()` (the training thread). Inside it, the
parts add up to the step:
- loader: time in the DataLoader's `__next__` (its own decoding, or waiting for its workers);
- compute: the ops the training thread ran (`cpu_op` events; on a GPU, its compute kernels). Spans that only name a
  region (DDP's forward, a user's `record_function`) are not work: a rank can wait for another inside them;
- waiting for other ranks: the part of a collective a rank spends before the last rank arrives, with nothing else to
  do. No clock is shared between ranks (nodes' clocks differ): a collective ends at the same moment on every rank, so
  at the k-th collective of a step, a rank that took w ms longer than the shortest arrived w ms before the last one;
- exposed communication: the rest of the collectives' time with the training thread idle (the transfer itself);
- other: what the profiler does not record (Python between ops, a sleep).
A slowdown is decided from these, step by step, against the noise the same run shows (the spread between its steps,
the last rank's own transfer time), and from what each trace says of its threads and cores (the metadata the
doctor's instruments add); never from the script's text, nor from the step's length.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from .doctor_report import Code, Finding

PROFILE_CODES = {
    "straggler": Code(5, "one rank is slower; the others wait for it at its collectives"),
    "loader-bound": Code(5, "the step waits for the DataLoader"),
    "exposed-communication": Code(5, "communication the backward does not hide"),
    "threads-oversubscribed": Code(5, "ranks x threads per rank exceed the cores"),
}
# What a slowdown must cost to be worth a line: a share of the step, in most steps (MOST). Whether it is there at all
# is decided against the run's own noise (ABOVE_NOISE times it), never by these shares alone.
SHARE = {"loader": 0.25, "exposed": 0.25, "waiting": 0.10}
MOST = 0.8  # "in most steps": 4 of 5
ABOVE_NOISE = 3.0
PARTS = ("compute", "loader", "exposed", "waiting", "other")
LOADER_PREFIX = "enumerate(DataLoader)#"


@dataclass
class Step:
    """One profiled step of one rank, in ms; its parts add up to total."""
    number: int
    total: float
    compute: float
    loader: float
    exposed: float  # communication with the training thread idle, waiting for others excluded (set by read_traces)
    waiting: float = 0.0  # waiting for a later rank at the collectives, with nothing else to do (set by read_traces)
    gpu: bool = False  # the trace holds GPU kernels: compute and communication are the device's
    meta: dict = field(default_factory=dict)
    collectives: list = field(default_factory=list)  # (name, start, end) ms on this rank's clock, in start order
    covered: list = field(default_factory=list)  # merged intervals (ms) of the training thread's work and loading
    caused: dict = field(default_factory=dict)  # {rank: ms this rank waited, exposed, at the collectives it was last}
    transfer: dict = field(default_factory=dict)  # {rank: ms of the collectives where it was last, on that rank}
    late_at: dict = field(default_factory=dict)  # {rank: "the k-th of the step's n collectives (name)"} it was last at
    loader_workers: bool | None = None  # the DataLoader read from worker processes (None: no loader seen)
    hidden: float = 0.0  # communication while the training thread worked: what the backward did hide

    @property
    def other(self) -> float:
        return max(0.0, self.total - self.compute - self.loader - self.exposed - self.waiting)


def _union(intervals):
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        elif end > start:
            merged.append([start, end])
    return merged


def _length(merged):
    return sum(end - start for start, end in merged)


def _minus(merged, cut):
    """The parts of MERGED (merged intervals) outside CUT (merged intervals)."""
    out = []
    for start, end in merged:
        for c_start, c_end in cut:
            if c_end <= start or c_start >= end:
                continue
            if c_start > start:
                out.append([start, c_start])
            start = max(start, c_end)
            if start >= end:
                break
        if start < end:
            out.append([start, end])
    return out


def _clip(intervals, start, end):
    return [(max(s, start), min(e, end)) for s, e in intervals if e > start and s < end]


def _spread(values) -> float:
    """How far the values scatter: 1.4826 x their median absolute deviation (the standard deviation, for noise that
    is normal; a few outlying steps do not inflate it)."""
    values = list(values)
    if len(values) < 2:
        return 0.0
    middle = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - middle) for v in values)


def is_communication(event) -> bool:
    """A collective's own time: gloo's (on its threads, CPU) or NCCL's kernels (GPU)."""
    name = event.get("name", "")
    return name.startswith("gloo:") or (event.get("cat") == "kernel" and "nccl" in name.lower())


def _is_work(event, main) -> bool:
    """An op of the training thread: work done, not a region's name (DDP's forward, a record_function) inside which it
    may wait, nor a collective's enqueue or wait (c10d::)."""
    return (event["tid"] == main and event.get("cat") == "cpu_op" and not event["name"].startswith("c10d::"))


def read_trace(path) -> tuple[list[Step], dict]:
    """The profiled steps of one rank's Chrome trace (torch.profiler's export_chrome_trace), and its metadata. The
    steps' waiting is set by read_traces, which sees every rank: here all exposed communication is in `exposed`."""
    trace = json.loads(Path(path).read_text())
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    meta = {k: v for k, v in trace.items() if k != "traceEvents"}
    # the training thread's marks: Kineto copies them onto the GPU's streams too (gpu_user_annotation)
    marks = [e for e in events if e.get("name", "").startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation"]
    if not marks:
        return [], meta
    main = marks[0]["tid"]
    span = lambda e: (e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3)  # noqa: E731 (ms)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    on_gpu = bool(kernels)
    work = [span(e) for e in (kernels if on_gpu else events)
            if (not is_communication(e) if on_gpu else _is_work(e, main))]
    loads = [e for e in events if e["tid"] == main and e["name"].startswith(LOADER_PREFIX)]
    loader = [span(e) for e in loads]
    collectives = sorted((span(e) + (e["name"],) for e in events if is_communication(e)))
    steps = []
    for mark in sorted(marks, key=lambda e: e["ts"]):
        start, end = span(mark)
        in_loader = _union(_clip(loader, start, end))
        busy = _union(_clip(work, start, end))
        covered = _union([tuple(i) for i in busy + in_loader])
        mine = [(name, s, e) for s, e, name in collectives if start <= s < end]
        comm = _union(_clip([(s, e) for _, s, e in mine], start, end))
        in_workers = [("_MultiProcessing" in e["name"]) for e in loads if start <= e["ts"] / 1e3 < end]
        steps.append(Step(int(mark["name"].split("#")[1]), end - start,
                          _length(busy) if on_gpu else _length(_minus(busy, in_loader)), _length(in_loader),
                          _length(_minus(comm, covered)), gpu=on_gpu, meta=meta, collectives=mine, covered=covered,
                          loader_workers=any(in_workers) if in_workers else None,
                          hidden=_length(comm) - _length(_minus(comm, covered))))
    return steps, meta


def _ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def _split_waiting(same: dict[int, Step]):
    """Split each rank's exposed communication in one step into waiting for a later rank and the transfer itself, by
    matching the k-th collective of the step across ranks: they end together, so the rank with the shortest one (the
    last to arrive) waited only for the transfer, and each other rank waited its difference from it, at the start."""
    lists = [tuple(name for name, _, _ in step.collectives) for step in same.values()]
    if not lists[0] or any(names != lists[0] for names in lists):
        # not the same collectives in the same order (a rank skipped one): the whole step's exposed time instead
        least = min(step.exposed for step in same.values())
        last = min(same, key=lambda r: same[r].exposed)
        for step in same.values():
            step.waiting, step.exposed = step.exposed - least, least
            step.caused = {last: statistics.median([s.waiting for r, s in same.items() if r != last] or [0.0])}
            step.transfer, step.late_at = {last: least}, {last: "its collectives"}
        return
    count = len(lists[0])
    caused = {rank: {other: 0.0 for other in same if other != rank} for rank in same}
    transfer, worst = {}, {}
    waited = {rank: [] for rank in same}
    for k in range(count):
        length = {rank: step.collectives[k][2] - step.collectives[k][1] for rank, step in same.items()}
        last = min(length, key=length.get)
        for rank, step in same.items():
            name, start, _ = step.collectives[k]
            wait = _union([(start, start + length[rank] - length[last])])
            exposed_wait = _length(_minus(_minus(wait, step.covered), _union(waited[rank])))
            waited[rank] += [tuple(i) for i in wait]
            if rank != last:
                caused[last][rank] += exposed_wait
                if exposed_wait > worst.get(last, (0.0, ""))[0]:
                    worst[last] = (exposed_wait, f"the {_ordinal(k + 1)} of the step's {count} collectives ({name})")
        transfer[last] = transfer.get(last, 0.0) + length[last]
    shared_caused = {rank: statistics.median(by.values()) for rank, by in caused.items() if by}
    for rank, step in same.items():
        waiting = _length(_minus(_union(waited[rank]), step.covered))
        step.waiting, step.exposed = min(waiting, step.exposed), max(0.0, step.exposed - waiting)
        step.caused, step.transfer = shared_caused, transfer
        step.late_at = {r: where for r, (_, where) in worst.items()}


def read_traces(paths) -> dict[int, list[Step]]:
    """{rank: its profiled steps} from one trace per rank (in rank order, or named by the trace's own rank), with
    each step's waiting for other ranks split from its exposed communication (_split_waiting)."""
    ranks = {}
    for index, path in enumerate(paths):
        steps, meta = read_trace(path)
        rank = (meta.get("distributedInfo") or {}).get("rank", index)
        ranks[int(rank)] = steps
    common = set.intersection(*(set(s.number for s in steps) for steps in ranks.values())) if ranks else set()
    for number in common:
        _split_waiting({rank: next(s for s in steps if s.number == number) for rank, steps in ranks.items()})
    return {rank: sorted((s for s in steps if s.number in common), key=lambda s: s.number)
            for rank, steps in sorted(ranks.items())}


def breakdown(ranks: dict[int, list[Step]]) -> dict[int, dict[str, float]]:
    """Per rank, its median step (by length) and that step's parts in ms, which add up to it: compute, loader,
    exposed (communication, waiting excluded), waiting (for other ranks), other (not recorded)."""
    table = {}
    for rank, steps in ranks.items():
        if steps:
            step = sorted(steps, key=lambda s: s.total)[(len(steps) - 1) // 2]
            table[rank] = {"step": step.total, **{part: getattr(step, part) for part in PARTS}}
    return table


def format_breakdown(table: dict[int, dict[str, float]]) -> str:
    """The table as text: one line per rank, its median step's parts in ms and their share of it."""
    lines = [f"{'rank':>4} {'step ms':>9}" + "".join(f"{p:>15}" for p in PARTS)]
    for rank, row in table.items():
        share = {p: round(100 * row[p] / row["step"]) if row["step"] else 0 for p in PARTS}
        lines.append(f"{rank:>4} {row['step']:>9.1f}" + "".join(f"{row[p]:>10.1f} {share[p]:>3d}%" for p in PARTS))
    return "\n".join(lines)


def _threads_and_cores(meta: dict) -> dict:
    seen = meta.get("threads_and_cores")
    return (json.loads(seen) if isinstance(seen, str) else seen) or {}


def _hosts(metas: dict[int, dict]) -> dict[str, tuple[int, int, int]]:
    """{host: (ranks, their intra-op threads together, the cores they may use together)} from what each trace says
    ("threads_and_cores": threads, the rank's CPUs or their count, its host). The cores are the union of the ranks'
    CPU sets: ranks pinned to cores of their own are not counted against each other's."""
    hosts = {}
    for meta in metas.values():
        seen = _threads_and_cores(meta)
        if not seen:
            continue
        host = hosts.setdefault(seen.get("host") or meta.get("host_name", "?"), [0, 0, set(), 0])
        host[0] += 1
        host[1] += int(seen["threads"])
        host[2] |= set(seen.get("cpus", []))
        host[3] = max(host[3], int(seen["cores"]))
    return {host: (n, threads, len(cpus) or cores) for host, (n, threads, cpus, cores) in hosts.items()}


def oversubscribed(metas: dict[int, dict]) -> list[tuple[str, int, int, int]]:
    """(host, ranks, threads, cores) for each host whose ranks' intra-op threads together exceed their cores."""
    return [(host, n, threads, cores) for host, (n, threads, cores) in _hosts(metas).items() if threads > cores]


def _cores_to_spare(metas: dict[int, dict]) -> float | None:
    """Cores a rank could give to loader workers: its host's cores less all its ranks' threads, per rank."""
    hosts = _hosts(metas)
    return min((cores - threads) / n for n, threads, cores in hosts.values()) if hosts else None


def _steps_by_number(ranks):
    numbers = [s.number for s in next(iter(ranks.values()))]
    return numbers, [{rank: steps[i] for rank, steps in ranks.items()} for i in range(len(numbers))]


def judge(ranks: dict[int, list[Step]], metas: dict[int, dict] | None = None) -> tuple[list[Finding], list[str]]:
    """The slowdowns the steps show, each a Finding whose line starts with its code, the costliest first; and a line
    for each that would cost enough but does not stand clear of this run's noise ("can't judge", with the numbers).

    A part counts when it costs its SHARE of the step in MOST steps, and is found when its median share less that
    median's uncertainty (from the shares' spread) still does. A straggler is a rank that others wait for at its
    collectives in MOST steps, by more than ABOVE_NOISE times the spread of those waits and of their own steps'
    length without them, and by more than the collectives' own transfer time (the last rank's); unless its extra
    time is the machine's, not its own (_why_late)."""
    metas = metas or {}
    ranks = {rank: steps for rank, steps in ranks.items() if steps}
    if not ranks:
        return [], []
    numbers, by_step = _steps_by_number(ranks)
    n, most = len(numbers), MOST * len(numbers)
    table = breakdown(ranks)
    crowded = oversubscribed(metas)
    found, unsure = [], []  # found: (share, Finding)

    def decide(part, rank, label):
        """(found, share) for one rank's part, and a can't-judge line where the noise swamps it."""
        shares = [getattr(step[rank], part) / step[rank].total for step in by_step if step[rank].total]
        costly = sum(s >= SHARE[part] for s in shares)
        # the median's own uncertainty: about 1.25 spread / sqrt(steps) for noise that is normal
        share, noise = statistics.median(shares), 1.25 * _spread(shares) / len(shares) ** 0.5
        if share < SHARE[part]:
            return False, 0.0
        if costly >= most and share - noise >= SHARE[part]:
            return True, share
        unsure.append(f"can't judge {label}: rank {rank}'s {part} is {100 * min(shares):.0f}–{100 * max(shares):.0f}%"
                      f" of its steps ({costly} of {n} at {100 * SHARE[part]:.0f}% or more; median {100 * share:.0f}%"
                      f" ± {100 * noise:.0f}%), too close to the rule's {100 * SHARE[part]:.0f}% for this run's"
                      f" noise: run more steps, on a quieter machine")
        return False, 0.0

    if len(ranks) > 1 and not crowded:  # ranks that take turns on the cores are unequal: that is the cause to fix
        for slow in ranks:
            others = [r for r in ranks if r != slow]
            caused = [step[slow].caused.get(slow, 0.0) for step in by_step]
            their_step = [statistics.median(step[r].total for r in others) for step in by_step]
            costly = sum(c >= SHARE["waiting"] * t for c, t in zip(caused, their_step))
            if costly < most:
                continue
            effect, step_ms = statistics.median(caused), statistics.median(their_step)
            transfer = statistics.median(step[slow].transfer.get(slow, 0.0) for step in by_step)
            # the noise: how much the waits and the steps scatter; and a wait shorter than the collective's own
            # transfer is within what any collective costs
            noise = max(_spread(caused),
                        statistics.median(_spread(s.total - s.waiting for s in ranks[r]) for r in others))
            late = sum(c > max(noise, transfer) for c in caused)
            clear = late >= most and effect >= ABOVE_NOISE * noise and effect >= transfer
            kind, because = _why_late(slow, others, ranks, metas, effect) if clear else ("", "")
            if kind == "machine":
                unsure.append(f"can't judge whether rank {slow} is a straggler: the others wait for it {effect:.1f} ms"
                              f" of their {step_ms:.1f} ms step, in {late} of {n} steps, but {because}")
            elif clear:
                found.append((effect / step_ms, _straggler(slow, others, ranks, metas, by_step, effect, step_ms, late,
                                                           n, because)))
            elif effect >= max(noise, transfer):  # above the noise, not clear of it: say so; below it, nothing
                unsure.append(f"can't judge whether rank {slow} is a straggler: the others wait for it {effect:.1f} ms"
                              f" of their {step_ms:.1f} ms step, against this run's noise: waits and steps that"
                              f" vary by {noise:.1f} ms, a transfer of {transfer:.1f} ms at those collectives: run"
                              f" more steps, on a quieter machine")
    worst = max(table, key=lambda r: table[r]["loader"] / table[r]["step"] if table[r]["step"] else 0)
    is_loader, share = decide("loader", worst, "whether the steps wait for the DataLoader")
    if is_loader:
        found.append((share, Finding("loader-bound", _loader_line(worst, ranks[worst], share, metas))))
    if not crowded:  # a collective waits for a rank that has no core: that is the threads, not the communication
        first = min(table)
        is_exposed, share = decide("exposed", first, "whether communication is exposed")
        if is_exposed:
            row = table[first]
            hidden = statistics.median(s.hidden for s in ranks[first])
            advice = ("the collectives already overlap the work (DDP's buckets): give each rank more work a step (a"
                      " larger per-rank batch, or accumulation with no_sync)" if hidden >= row["exposed"] / 10 else
                      "none of it overlaps the work: let DDP's buckets overlap it with the backward (no all-reduce by"
                      " hand after it), or give each rank more work a step")
            found.append((share, Finding("exposed-communication", (
                f"rank {first}'s steps wait {100 * share:.0f}% of their time for communication that the work does"
                f" not hide (its median step: {row['exposed']:.1f} of {row['step']:.1f} ms, compute"
                f" {row['compute']:.1f} ms, {hidden:.1f} ms of communication hidden) — {advice}, lesson 06b"))))
    for host, count, threads, cores in crowded:
        found.append((1.0, Finding("threads-oversubscribed", (
            f"{count} ranks on {host} use {threads} intra-op threads together on {cores} cores: they take turns on"
            f" the cores, so their waits and communication are not judged apart — OMP_NUM_THREADS=cores/ranks"
            f" (torchrun sets 1 unless told otherwise), or torch.set_num_threads, lesson 06b"))))
    return [f for _, f in sorted(found, key=lambda pair: -pair[0])], unsure


def _why_late(slow, others, ranks, metas, effect) -> tuple[str, str]:
    """What makes a late rank late, from its own time: ("longer", what) when a part of its step is longer than the
    others' by at least half its lateness (its ops, its loader, or time no op records: a sleep, Python); ("own time",
    what) when none is, yet it has that much time no op records (late at one collective, early at another);
    ("machine", why) when its longer ops or loading got no more CPU time than the others' (its threads waited for a
    core that other programs held), or when nothing of its own explains the lateness (the OS ran it later)."""
    mine = {p: statistics.median(getattr(s, p) for s in ranks[slow]) for p in ("compute", "loader", "other")}
    theirs = {p: statistics.median(getattr(s, p) for r in others for s in ranks[r]) for p in mine}
    part = max(mine, key=lambda p: mine[p] - theirs[p])
    extra = mine[part] - theirs[part]
    cpu = {r: metas.get(r, {}).get("cpu_and_wall_ms", [None])[0] for r in [slow, *others]}
    on_cpu = not any(s.gpu for s in ranks[slow]) and None not in cpu.values()
    if extra >= effect / 2 and part != "other":
        their_cpu = statistics.median(cpu[r] for r in others) if on_cpu else None
        if on_cpu and cpu[slow] - their_cpu < effect / 2:
            return "machine", (f"its longer {'ops' if part == 'compute' else 'loading'} got no more CPU time than"
                               f" theirs ({cpu[slow]:.1f} against {their_cpu:.1f} CPU-ms a step): its threads waited"
                               f" for a core that other programs held, not for more work. Run it with the cores free")
        return "longer", f"it spends {extra:.1f} ms a step more than they do in {part}"
    if extra >= effect / 2:
        lines = {r: metas.get(r, {}).get("lines_ms_a_step") for r in [slow, *others]}
        if all(lines.values()):  # sampled: a sleep or Python of the script's own is at one of its lines
            at_line = max(ms - statistics.median(lines[r].get(line, 0.0) for r in others)
                          for line, ms in lines[slow].items())
            if at_line < effect / 2:
                return "machine", (f"its extra {extra:.1f} ms a step are in no op and at no line of the script (the"
                                   f" instruments sample its lines): the OS ran it later (a busy machine), not its"
                                   f" code")
        return "longer", f"it spends {extra:.1f} ms a step more than they do in work the profiler does not record"
    if mine["other"] >= effect / 2:
        return "own time", (f"its steps are no longer than theirs, but {mine['other']:.1f} ms a step of it is in no op"
                            f" (a sleep, Python): late at this collective, early at another")
    return "machine", (f"nothing of its own makes it late: no part of its step is longer than theirs, and"
                       f" {mine['other']:.1f} ms a step is in no op. The OS ran it later (a busy machine), not its code")


def _straggler(slow, others, ranks, metas, by_step, effect, step_ms, late, n, because) -> Finding:
    wheres = [step[slow].late_at.get(slow) for step in by_step if step[slow].late_at.get(slow)]
    at = f" at {max(set(wheres), key=wheres.count)}" if wheres else ""
    # where its extra time goes: the script's line it spends longest at against the others (the instruments sample
    # each rank's training thread through the recorded steps)
    lines = {r: metas.get(r, {}).get("lines_ms_a_step", {}) for r in [slow, *others]}
    extra = {line: ms - statistics.median(lines[r].get(line, 0.0) for r in others) for line, ms in lines[slow].items()}
    if extra and max(extra.values()) >= effect / 2:
        line = max(extra, key=extra.get)
        because = f"its extra time is at {line} (+{extra[line]:.1f} ms a step)"
    return Finding("straggler", (
        f"rank {slow} arrives last: the other ranks wait for it {effect:.1f} ms of their {step_ms:.1f} ms step"
        f" ({100 * effect / step_ms:.0f}%){at}, last in {late} of {n} steps; {because} — give every rank the same"
        f" work (batch, data, no rank-0-only work inside the loop), lesson 06b"))


def _loader_line(rank, steps, share, metas) -> str:
    row = sorted(steps, key=lambda s: s.total)[(len(steps) - 1) // 2]
    workers = any(s.loader_workers for s in steps)
    spare = _cores_to_spare(metas)
    if spare is not None and spare < 1:
        advice = (f"no core is free for {'more ' if workers else ''}loader workers here (the ranks' threads use them"
                  f" all): decode once ahead of training, or make each sample cheaper")
    elif workers:
        advice = ("its DataLoader already reads from workers: more of them (num_workers"
                  f"{f', up to {spare:.0f} more a rank on this host' if spare else ''}), or decode once ahead")
    else:
        advice = (f"decode in DataLoader workers (num_workers{f', {spare:.0f} a rank on this host' if spare else ''},"
                  f" persistent_workers), or prepare the data once ahead")
    return (f"rank {rank}'s steps wait for the DataLoader {100 * share:.0f}% of their time (its median step:"
            f" {row.loader:.1f} of {row.total:.1f} ms) — {advice}, lesson 06")


def profile_findings(ranks: dict[int, list[Step]], metas: dict[int, dict] | None = None) -> list[Finding]:
    """The slowdowns found (judge's first half)."""
    return judge(ranks, metas)[0]


def read_profile(out_dir, world: int) -> tuple[dict, dict, list[str], str | None]:
    """What the --profile instruments wrote to OUT_DIR for WORLD ranks: (steps by rank, metadata by rank, the lines
    to print before the findings, why there is no profile, or None)."""
    out_dir = Path(out_dir)
    progress = {}
    for rank in range(world):
        error = out_dir / f"rank{rank}.error"
        if error.exists():
            return {}, {}, [], f"the profiler's instruments failed in rank {rank}: {error.read_text().strip()}"
        try:
            progress[rank] = json.loads((out_dir / f"rank{rank}.steps.json").read_text())
        except (OSError, ValueError):
            return {}, {}, [], (f"rank {rank} wrote no profile: its instruments did not load there (python -E or -I"
                                f" ignores PYTHONPATH), or it was killed")
    backed = [rank for rank, seen in progress.items() if seen.get("stepped_back")]
    if backed:  # the script's own torch.profiler ran with ours: ours gave way (two in one process crash it)
        return {}, {}, [], progress[backed[0]]["error"]
    for rank, seen in progress.items():
        if seen.get("error"):
            return {}, {}, [], f"the profiler failed in rank {rank}: {seen['error']} (is the script profiling itself?)"
        if len(seen["stamps"]) < seen["needed"]:
            return {}, {}, [], (f"rank {rank} made {len(seen['stamps'])} optimizer step(s), and --profile needs"
                                f" {seen['needed']} (1 to warm up, 3 timed, 1 + 5 profiled): give the script more"
                                f" steps (its own arguments after --)")
    traces = [out_dir / f"rank{rank}.json" for rank in range(world)]
    missing = [t.name for t in traces if not t.exists()]
    if missing:
        return {}, {}, [], f"no trace from {missing[0]}: the profiler did not export it"
    ranks = read_traces(traces)
    metas = {rank: dict(steps[0].meta) if steps else {} for rank, steps in ranks.items()}
    for rank, meta in metas.items():  # the CPU time the rank's threads got in the profiled steps, and the wall time
        cpu, wall, (start, end) = progress[rank].get("cpu_stamps"), progress[rank]["stamps"], progress[rank]["profiled"]
        if progress[rank].get("lines_ms"):
            meta["lines_ms_a_step"] = {line: ms / progress[rank]["sampled_steps"]
                                       for line, ms in progress[rank]["lines_ms"].items()}
        if cpu and len(cpu) >= end:
            meta["cpu_and_wall_ms"] = [1e3 * (cpu[end - 1] - cpu[start - 1]) / (end - start),
                                       1e3 * (wall[end - 1] - wall[start - 1]) / (end - start)]
    seen = progress[0]
    stamps = seen["stamps"]
    def step_times(first, end):  # stamps[i] is taken after step i + 1
        return [stamps[i] - stamps[i - 1] for i in range(first, end)]
    timed, profiled = step_times(*seen["timed"]), step_times(*seen["profiled"])
    cost = statistics.median(profiled) / statistics.median(timed) if timed and profiled else float("nan")
    first, last = seen["profiled"][0] + 1, seen["needed"]
    lines = [f"profile: steps {first} to {last} of every rank; each rank's median step, in ms, and its parts:",
             format_breakdown(breakdown(ranks)),
             f"profile cost: rank 0's profiled steps took {cost:.2f}x its steps 2 to 4, timed without the profiler"
             f" (one run's ratio: noisy on a busy machine)"]
    return ranks, metas, lines, None
