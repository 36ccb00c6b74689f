"""The DDP doctor: run any script under torchrun with instruments in every rank, and report the classic mistakes.

    lessons.doctor("train.py", nproc=2, args=["--epochs", "2"])
    python -m lessons doctor train.py -n 2 -- --epochs 2

The script is not changed: lessons/doctor_site/sitecustomize.py is put first on the ranks' PYTHONPATH, and Python
loads it into each rank before the script. Each rank writes what it saw to a file in a temporary directory; after
the launch the doctor compares the ranks and prints one line per finding, each starting with a stable code.
Exit status (``report.status``, and the command's): 0 nothing found, 1 something found, 2 the script can't be run.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .launch import LaunchError, LaunchResult, torchrun

SITE_DIR = Path(__file__).resolve().parent / "doctor_site"
CODES = ("no-set-epoch", "save-on-every-rank", "load-without-map-location", "weights-only-off", "params-diverged",
         "collectives-differ", "no-destroy")
PARAMS_ATOL = 1e-6  # float32 all-reduced gradients give the ranks the same bits; any drift is a real difference


@dataclass
class Finding:
    code: str
    message: str

    def __str__(self):
        return f"{self.code}: {self.message}"


@dataclass
class DoctorReport:
    findings: list[Finding] = field(default_factory=list)
    launch: LaunchResult | None = None  # what the ranks printed; .result is rank 0's RESULT
    error: str | None = None  # why the script could not be run (or failed), in one line

    @property
    def status(self) -> int:
        """0: nothing found; 1: something found; 2: the script can't be run (and nothing was found)."""
        return 1 if self.findings else 2 if self.error else 0

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def __str__(self):
        lines = [str(f) for f in self.findings]
        if self.error:
            lines.append(f"the script did not run to the end: {self.error}")
        if not lines:
            lines.append("no findings")
        return "\n".join(lines)


def doctor(script: str | os.PathLike, nproc: int = 2, args: tuple | list = (), timeout: float | None = 300,
           show: bool = False, env: dict[str, str] | None = None) -> DoctorReport:
    """Launch SCRIPT under torchrun with NPROC ranks, instrumented, and return the findings (print it to read it)."""
    script = Path(script)
    if not script.is_file():
        return DoctorReport(error=f"no such script: {script}")
    with tempfile.TemporaryDirectory(prefix="ddp_doctor_") as out_dir:
        python_path = os.pathsep.join(p for p in (str(SITE_DIR), (env or {}).get("PYTHONPATH",
                                                  os.environ.get("PYTHONPATH", ""))) if p)
        launch_env = {**(env or {}), "PYTHONPATH": python_path, "LESSONS_DOCTOR_DIR": out_dir}
        launch_env.pop("LESSONS_DOCTOR_RANK_PID", None)
        report = DoctorReport()
        try:
            report.launch = torchrun(script, nproc=nproc, args=[str(a) for a in args], timeout=timeout,
                                     show=show, env=launch_env, live=False)
        except LaunchError as error:
            report.launch = error.result
            report.error = error.root_cause or str(error).splitlines()[0]
            if error.result is not None and error.result.stacks:  # a hang: every rank's stack, as torchrun gives it
                report.error = str(error)
        except ValueError as error:  # bad arguments (nproc, timeout): one line
            return DoctorReport(error=str(error))
        report.findings = examine(Path(out_dir), nproc)
    return report


def _events(out_dir: Path, nproc: int) -> dict[int, list[dict]]:
    events = {}
    for rank in range(nproc):
        path = out_dir / f"rank{rank}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        events[rank] = [json.loads(line) for line in lines if line.strip()]
    return events


def examine(out_dir: Path, nproc: int) -> list[Finding]:
    """Read what each rank recorded and turn it into findings, in the order of CODES."""
    events = _events(out_dir, nproc)
    findings = []

    # no-set-epoch: a shuffling sampler iterated twice at the same epoch.
    for rank in sorted(events):
        last_epoch, flagged = {}, set()
        for e in events[rank]:
            if e["event"] == "sampler_iter" and e["shuffle"]:
                if last_epoch.get(e["sampler"]) == e["epoch"] and e["sampler"] not in flagged:
                    flagged.add(e["sampler"])
                    findings.append(Finding("no-set-epoch", (
                        f"rank {rank}: a DistributedSampler(shuffle=True) was iterated again at epoch {e['epoch']};"
                        " call sampler.set_epoch(epoch) before each epoch, or every epoch sees the same order"
                        " (lesson 05)")))
                last_epoch[e["sampler"]] = e["epoch"]
        if flagged:
            break  # one rank says it: the others do the same

    # save-on-every-rank: the same path written by more than one rank.
    savers = {}
    for rank, evs in events.items():
        for e in evs:
            if e["event"] == "save":
                savers.setdefault(e["path"], set()).add(rank)
    for path, ranks in savers.items():
        if len(ranks) > 1:
            findings.append(Finding("save-on-every-rank", (
                f"ranks {', '.join(map(str, sorted(ranks)))} all called torch.save({path!r}); the ranks hold the same"
                " weights, so they write the same file at once: save on rank 0 only (lesson 07)")))

    loads = [(rank, e) for rank, evs in events.items() for e in evs if e["event"] == "load"]
    if nproc > 1:
        for rank, e in loads:
            if not e["map_location"]:
                findings.append(Finding("load-without-map-location", (
                    f"rank {rank}: torch.load({e['path']!r}) without map_location; on GPUs every rank then loads the"
                    " tensors onto the GPU they were saved from (cuda:0), filling its memory and slowing rank 0:"
                    " pass map_location=device (lesson 07)")))
                break
    for rank, e in loads:
        if e["weights_only"] is False:
            findings.append(Finding("weights-only-off", (
                f"rank {rank}: torch.load({e['path']!r}, weights_only=False) runs any code pickled in the file;"
                " save tensors and plain values, and load with weights_only=True (lesson 07)")))
            break

    findings += _params_diverged(out_dir, nproc)
    findings += _collectives_differ(events)

    exits = {rank: next((e for e in evs if e["event"] == "exit"), None) for rank, evs in events.items()}
    undestroyed = [rank for rank, e in exits.items() if e and e["initialized"]]
    if undestroyed:
        findings.append(Finding("no-destroy", (
            f"rank(s) {', '.join(map(str, undestroyed))} exited with the process group never destroyed; end with"
            " dist.destroy_process_group(), or the exit can hang or abort (lesson 00)")))
    return findings


def _params_diverged(out_dir: Path, nproc: int) -> list[Finding]:
    files = {rank: out_dir / f"rank{rank}.params.pt" for rank in range(nproc)}
    files = {rank: path for rank, path in files.items() if path.exists()}
    if len(files) < 2:
        return []
    import torch  # only here: the kernel that calls the doctor may not have it yet

    params = {rank: torch.load(path, map_location="cpu", weights_only=True) for rank, path in files.items()}
    reference_rank = min(params)
    worst = (0.0, None, None)
    for rank, tensors in params.items():
        for name, value in tensors.items():
            other = params[reference_rank].get(name)
            if other is None or other.shape != value.shape:
                return [Finding("params-diverged", f"rank {rank}: parameter {name} differs in shape from rank"
                                f" {reference_rank}'s")]
            diff = (value - other).abs().max().item() if value.numel() else 0.0
            if diff > worst[0]:
                worst = (diff, name, rank)
    diff, name, rank = worst
    if diff <= PARAMS_ATOL:
        return []
    name = name.split(".", 1)[1]
    return [Finding("params-diverged", (
        f"at exit the DDP model's parameters differ between ranks: largest difference {diff:.3g} in {name}"
        f" (rank {rank} vs rank {reference_rank}); something changed the weights outside DDP's backward/step on"
        " some ranks only (lesson 03)"))]


def _collectives_differ(events: dict[int, list[dict]]) -> list[Finding]:
    sequences = {rank: [(e["op"], e["shape"]) for e in evs if e["event"] == "collective"]
                 for rank, evs in events.items()}
    if len(sequences) < 2:
        return []
    reference_rank = min(sequences)
    reference = sequences[reference_rank]
    for rank, sequence in sorted(sequences.items()):
        if sequence == reference:
            continue
        place = next((i for i, (a, b) in enumerate(zip(reference, sequence)) if a != b), min(len(reference),
                                                                                             len(sequence)))

        def call(seq, r):
            if place >= len(seq):
                return f"rank {r} made no call #{place + 1} ({len(seq)} collectives in all)"
            op, shape = seq[place]
            return f"rank {r} called {op}" + (f" on {_shape_text(shape)}" if shape else "")

        return [Finding("collectives-differ", (
            f"the ranks' collectives part at call #{place + 1}: {call(reference, reference_rank)}, "
            f"{call(sequence, rank)}; every rank must make the same collectives in the same order with the same"
            " shapes, or the job hangs or fails (lessons 11 and 11b)"))]
    return []


def _shape_text(shape) -> str:
    if shape and isinstance(shape[0], list) and len(shape) == 2 and isinstance(shape[1], str):
        return f"a {shape[1]} tensor of shape {tuple(shape[0])}"
    return f"{len(shape)} tensors"


def main(argv: list[str]) -> int:
    """python -m lessons doctor SCRIPT -n N [--timeout S] [-- ARGS]"""
    import argparse

    own, _, script_args = argv, None, []
    if "--" in argv:
        cut = argv.index("--")
        own, script_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="python -m lessons doctor",
                                     description="Run SCRIPT under torchrun with the DDP doctor's instruments.")
    parser.add_argument("script")
    parser.add_argument("-n", "--nproc", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300, help="seconds; 0 for none")
    options = parser.parse_args(own)
    report = doctor(options.script, nproc=options.nproc, args=script_args,
                    timeout=options.timeout or None)
    print(report)
    return report.status
