"""The doctor's rules about files: a checkpoint written by every rank, loads without (or with a useless)
map_location, weights_only=False. Registered in RULES, below."""

from __future__ import annotations

from .doctor_record import _in_a_library
from .doctor_report import Finding, Rule


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


RULES = [
    Rule(("save-on-every-rank", "load-without-map-location", "map-location-maps-nothing", "weights-only-off",
          "map-location-on-gpus"), ("init", "save", "load"), lambda f: _saves_and_loads(f.events, f.nproc)),
]
