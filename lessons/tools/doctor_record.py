"""The doctor's record: what the ranks wrote (their events, described in lessons/tools/doctor_events.py, and their
parameters at exit), read back; the passes over loaders; and the facts the rules share, built once (Facts)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Record:
    """What the ranks wrote: their events, and their parameters at exit."""
    events: dict[int, list[dict]]
    params: dict[int, dict]
    errors: dict[int, str]  # the instruments' own failures, by rank


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


def read_record(out_dir: Path, nproc: int) -> Record:
    import torch  # only here: the kernel that calls the doctor may not have it yet

    events, params, errors = {}, {}, {}
    for rank in range(nproc):
        path = out_dir / f"rank{rank}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        events[rank] = []
        for line in lines:
            try:
                events[rank].append(json.loads(line))
            except json.JSONDecodeError:  # the last line of a rank killed while writing it
                pass
        if (out_dir / f"rank{rank}.params.pt").exists():
            params[rank] = torch.load(out_dir / f"rank{rank}.params.pt", map_location="cpu", weights_only=True)
        if (out_dir / f"rank{rank}.error").exists():
            errors[rank] = (out_dir / f"rank{rank}.error").read_text().strip()
    return Record(events, params, errors)


def _first(events, kind):
    return next((e for evs in events.values() for e in evs if e["event"] == kind), None)


def _in_a_library(site: str | None) -> bool:
    return bool(site) and any(f"{os.sep}{folder}{os.sep}" in site for folder in ("site-packages", "dist-packages"))


def _shown_path(name: str) -> str:
    """As the ranks show their sites (doctor_site/sitecustomize.py): relative to here unless that climbs 2 folders."""
    try:
        relative = os.path.relpath(name)
    except ValueError:
        return name
    return name if relative.startswith(os.path.join("..", "..")) else relative
