"""The doctor's --profile: where each rank's step time goes, read from one torch.profiler trace per rank, and the
slowdowns it shows (lesson 06b).

    steps = read_traces(["trace/rank0.json", "trace/rank1.json"])   # {rank: [Step, ...]}, the profiled steps
    table = breakdown(steps)                                          # {rank: {"step": ms, "compute": ms, ...}}
    found = profile_findings(steps, facts)                            # [Finding], most costly first

A step is one `ProfilerStep#k` span of the thread that called `profiler.step()` (the training thread). Inside it:
- loader: time in the DataLoader's `__next__` (its own decoding, or waiting for its workers);
- compute: the other recorded work of the training thread (forward, backward, optimizer; on a GPU, its kernels);
- exposed communication: a collective running (gloo's threads, or NCCL's kernels) while the training thread has
  nothing recorded to do (on a GPU: while no compute kernel runs): the part the backward does not hide;
- waiting for other ranks: the part of it a rank spends because another arrived later. The rank that arrives last
  at a collective waits only for the transfer itself, so, step by step, a rank's exposed communication less the
  smallest of all ranks' is its wait. No clock is shared between ranks for this (nodes' clocks differ);
- other: what the profiler does not record (Python between ops, a sleep).
The findings are decided from these numbers and from what each rank's trace says of its threads and cores (the
metadata the doctor's instruments add), never from the script's text.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from .doctor_report import Code, Finding

# The slowdowns, in the order they are printed (the costliest first within a run is by share; see profile_findings).
PROFILE_CODES = {
    "straggler": Code(5, "one rank is slower; the others wait for it at every collective"),
    "loader-bound": Code(5, "the step waits for the DataLoader"),
    "exposed-communication": Code(5, "communication the backward does not hide"),
    "threads-oversubscribed": Code(5, "ranks x threads per rank exceed the cores"),
}
MIN_STEP_MS = 50.0  # CPU ranks: shorter steps are not judged (too_short says why)
SHARE = 0.25  # a slowdown is reported when it costs at least this share of the step (median over the steps)
STRAGGLER_SHARE = 0.40  # ... and a straggler when the others wait at least this share, the same rank last most steps
PARTS = ("compute", "loader", "exposed", "waiting", "other")
LOADER_PREFIX = "enumerate(DataLoader)#"


@dataclass
class Step:
    """One profiled step of one rank, in ms."""
    number: int
    total: float
    compute: float
    loader: float
    exposed: float  # communication with the training thread idle (waiting for others included)
    waiting: float = 0.0  # set by read_traces: the part of exposed spent waiting for a later rank
    gpu: bool = False  # the trace holds GPU kernels: compute and communication are the device's
    meta: dict = field(default_factory=dict)


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


def is_communication(event) -> bool:
    """A collective's own time: gloo's (on its threads, CPU) or NCCL's kernels (GPU)."""
    name = event.get("name", "")
    return name.startswith("gloo:") or (event.get("cat") == "kernel" and "nccl" in name.lower())


def read_trace(path) -> tuple[list[Step], dict]:
    """The profiled steps of one rank's Chrome trace (torch.profiler's export_chrome_trace), and its metadata."""
    trace = json.loads(Path(path).read_text())
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    meta = {k: v for k, v in trace.items() if k != "traceEvents"}
    # the training thread's marks: Kineto copies them onto the GPU's streams too (gpu_user_annotation)
    marks = [e for e in events if e.get("name", "").startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation"]
    if not marks:
        return [], meta
    main = marks[0]["tid"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    on_gpu = bool(kernels)
    own = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["tid"] == main and e is not None
           and not e["name"].startswith("ProfilerStep#")]
    loader = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["tid"] == main
              and e["name"].startswith(LOADER_PREFIX)]
    communication = [(e["ts"], e["ts"] + e["dur"]) for e in events if is_communication(e)]
    computing = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if not is_communication(e)]
    steps = []
    for mark in sorted(marks, key=lambda e: e["ts"]):
        start, end = mark["ts"], mark["ts"] + mark["dur"]
        busy = _union(_clip(own, start, end))
        in_loader = _union(_clip(loader, start, end))
        comm = _union(_clip(communication, start, end))
        if on_gpu:  # the device's own timeline: compute kernels against NCCL's
            work = _union(_clip(computing, start, end))
            compute = _length(work)
            exposed = _length(_minus(comm, _union(work + in_loader)))
        else:  # the training thread's: recorded work against gloo's threads
            compute = _length(_minus(busy, in_loader))
            exposed = _length(_minus(comm, busy))
        steps.append(Step(int(mark["name"].split("#")[1]), mark["dur"] / 1e3, compute / 1e3, _length(in_loader) / 1e3,
                          exposed / 1e3, meta=meta, gpu=on_gpu))
    return steps, meta


def read_traces(paths) -> dict[int, list[Step]]:
    """{rank: its profiled steps} from one trace per rank (in rank order, or named by the trace's own rank), with
    each step's waiting for other ranks set: its exposed communication less the smallest of all ranks' that step."""
    ranks = {}
    for index, path in enumerate(paths):
        steps, meta = read_trace(path)
        rank = (meta.get("distributedInfo") or {}).get("rank", index)
        ranks[int(rank)] = steps
    common = set.intersection(*(set(s.number for s in steps) for steps in ranks.values())) if ranks else set()
    for number in common:
        same = [next(s for s in steps if s.number == number) for steps in ranks.values()]
        least = min(s.exposed for s in same)
        for s in same:
            s.waiting = s.exposed - least
    return {rank: sorted((s for s in steps if s.number in common), key=lambda s: s.number)
            for rank, steps in sorted(ranks.items())}


def breakdown(ranks: dict[int, list[Step]]) -> dict[int, dict[str, float]]:
    """Per rank, the median step and its parts in ms: compute, loader, exposed (communication, less waiting),
    waiting (for other ranks), other (not recorded)."""
    table = {}
    for rank, steps in ranks.items():
        if not steps:
            continue
        row = {"step": statistics.median(s.total for s in steps),
               "compute": statistics.median(s.compute for s in steps),
               "loader": statistics.median(s.loader for s in steps),
               "exposed": statistics.median(s.exposed - s.waiting for s in steps),
               "waiting": statistics.median(s.waiting for s in steps),
               # each step's own remainder, then the median: not the median step less the other medians
               "other": statistics.median(max(0.0, s.total - s.compute - s.loader - s.exposed) for s in steps)}
        table[rank] = row
    return table


def format_breakdown(table: dict[int, dict[str, float]]) -> str:
    """The table as text: one line per rank, ms per step (medians) and each part's share of the step."""
    lines = [f"{'rank':>4} {'step ms':>9}" + "".join(f"{p:>15}" for p in PARTS)]
    for rank, row in table.items():
        share = {p: round(100 * row[p] / row["step"]) if row["step"] else 0 for p in PARTS}
        lines.append(f"{rank:>4} {row['step']:>9.1f}" + "".join(f"{row[p]:>10.1f} {share[p]:>3d}%" for p in PARTS))
    return "\n".join(lines)


def oversubscribed(metas: dict[int, dict]) -> list[tuple[str, int, int, int]]:
    """(host, ranks, threads, cores) for each host whose ranks' intra-op threads together exceed the cores they may
    use together (the union of their CPU sets: ranks pinned to their own cores are not counted against each other's),
    from what each trace says ("threads_and_cores": threads, the rank's CPUs or their count, its host)."""
    hosts = {}
    for meta in metas.values():
        seen = meta.get("threads_and_cores")
        if isinstance(seen, str):
            seen = json.loads(seen)
        if not seen:
            continue
        host = hosts.setdefault(seen.get("host") or meta.get("host_name", "?"), [0, 0, set(), 0])
        host[0] += 1
        host[1] += int(seen["threads"])
        host[2] |= set(seen.get("cpus", []))
        host[3] = max(host[3], int(seen["cores"]))
    return [(host, n, threads, len(cpus) or cores) for host, (n, threads, cpus, cores) in hosts.items()
            if threads > (len(cpus) or cores)]


def too_short(ranks: dict[int, list[Step]], min_step_ms: float = MIN_STEP_MS) -> str | None:
    """Why the steps of CPU ranks are too short to judge, or None. On a CPU a thread waits milliseconds to be woken
    (gloo's all-reduce of a few KB took 0.5 to 25 ms here, the same on both ranks), and the profiler's own cost per
    op is a large share of a short step: a step shorter than MIN_STEP_MS would show them, not the script."""
    steps = [s for steps in ranks.values() for s in steps]
    if not steps or any(s.gpu for s in steps):
        return None
    step = statistics.median(s.total for s in steps)
    if step >= min_step_ms:
        return None
    return (f"no slowdowns judged: the steps take {step:.1f} ms under the profiler, and on CPU ranks --profile judges"
            f" steps of {min_step_ms:.0f} ms or more (a thread's wake-up and the profiler's own cost would be most of"
            f" a shorter one); give each step more work (a larger per-rank batch) to judge it")


def profile_findings(ranks: dict[int, list[Step]], metas: dict[int, dict] | None = None,
                     min_step_ms: float = MIN_STEP_MS) -> list[Finding]:
    """The slowdowns the steps show, each on a line starting with its code, the costliest first; none for CPU steps
    shorter than min_step_ms (too_short)."""
    table = breakdown(ranks)
    if not table or too_short(ranks, min_step_ms):
        return []
    found = []  # (share, Finding)

    def median_share(part):
        return statistics.median(row[part] / row["step"] for row in table.values() if row["step"])

    crowded = oversubscribed(metas or {})
    if len(table) > 1 and not crowded:  # ranks that take turns on the cores are unequal: that is the cause to fix
        numbers = [s.number for s in next(iter(ranks.values()))]
        last = [min(ranks, key=lambda r: next(s.exposed for s in ranks[r] if s.number == n)) for n in numbers]
        slowest = max(set(last), key=last.count)
        others = {r: row for r, row in table.items() if r != slowest}
        wait = statistics.median(row["waiting"] for row in others.values())
        step = statistics.median(row["step"] for row in others.values())
        if step and wait / step >= STRAGGLER_SHARE and last.count(slowest) > len(last) / 2:
            mine, theirs = table[slowest], {p: statistics.median(row[p] for row in others.values()) for p in PARTS}
            extra = max(("compute", "loader", "other"), key=lambda p: mine[p] - theirs[p])
            found.append((wait / step, Finding("straggler", (
                f"rank {slowest} is the slowest: the other ranks wait for it {wait:.1f} ms of their {step:.1f} ms"
                f" step ({100 * wait / step:.0f}%) at its collectives; it spends {mine[extra] - theirs[extra]:.1f} ms"
                f" a step more than they do in {'work the profiler does not record' if extra == 'other' else extra}"
                f" — give every rank the same work (batch, data, no rank-0-only work inside the loop), lesson 06b"))))
    loader = median_share("loader")
    if loader >= SHARE:
        worst = max(table, key=lambda r: table[r]["loader"])
        found.append((loader, Finding("loader-bound", (
            f"the steps wait for the DataLoader {100 * loader:.0f}% of the time (rank {worst}:"
            f" {table[worst]['loader']:.1f} of {table[worst]['step']:.1f} ms a step) — decode in DataLoader workers"
            f" (num_workers, persistent_workers), or prepare the data once ahead, lesson 06"))))
    exposed = median_share("exposed")
    if exposed >= SHARE:
        row = table[min(table)]
        found.append((exposed, Finding("exposed-communication", (
            f"{100 * exposed:.0f}% of each step waits for communication that the backward does not hide (rank"
            f" {min(table)}: {row['exposed']:.1f} of {row['step']:.1f} ms, compute {row['compute']:.1f} ms) — let"
            f" DDP's buckets overlap it (no all-reduce by hand after backward; bucket_cap_mb), or give each rank"
            f" more work a step (a larger per-rank batch, or accumulation with no_sync), lesson 06b"))))
    waits = max((row["waiting"] / row["step"] for row in table.values() if row["step"]), default=0.0)
    for host, n, threads, cores in crowded:
        found.append((1.0, Finding("threads-oversubscribed", (
            f"{n} ranks on {host} use {threads} intra-op threads together on {cores} cores: they take turns on the"
            f" cores{f', and a rank waits for the others up to {100 * waits:.0f}% of its step' if waits >= 0.1 else ''}"
            f" — OMP_NUM_THREADS="
            f"cores/ranks (torchrun sets 1 unless told otherwise), or torch.set_num_threads, lesson 06b"))))
    return [f for _, f in sorted(found, key=lambda pair: -pair[0])]


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
    metas = {rank: read_trace(path)[1] for rank, path in enumerate(traces)}
    seen = progress[0]
    stamps = seen["stamps"]
    def step_times(first, end):  # stamps[i] is taken after step i + 1
        return [stamps[i] - stamps[i - 1] for i in range(first, end)]
    timed, profiled = step_times(*seen["timed"]), step_times(*seen["profiled"])
    cost = statistics.median(profiled) / statistics.median(timed) if timed and profiled else float("nan")
    first, last = seen["profiled"][0] + 1, seen["needed"]
    lines = [f"profile: steps {first} to {last} of every rank, ms a step (medians over the steps):",
             format_breakdown(breakdown(ranks)),
             f"profile cost: rank 0's profiled steps took {cost:.2f}x its steps 2 to 4, timed without the profiler"
             f" (one run's ratio: noisy on a busy machine)"]
    short = too_short(ranks)
    return ranks, metas, lines + ([short] if short else []), None
