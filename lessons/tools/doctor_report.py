"""The doctor's report: the findings' codes (CODES: their severity and order), a finding, a rule, and the report of
a run (DoctorReport: its findings, notes, --compare's lines and the exit status)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .doctor_record import Record
    from .launch import LaunchResult


@dataclass(frozen=True)
class Code:
    """A finding's stable code: how serious it is, and what it says in one phrase (lesson 14b's table says more)."""
    severity: int  # 1 the trained model is not the one intended; 2 a waste or a corrupted file; 3 a risk;
    what: str  # 4 a note: right here, wrong elsewhere or slightly off (the exit status stays 0)
# In the order the findings are listed: the most serious first, and within a severity as here.
CODES = {
    "not-distributed": Code(1, "the script never forms a process group: N copies of one process"),
    "separate-models": Code(1, "every rank trains a model of its own"),
    "collective-in-branch": Code(1, "a collective inside a branch that some ranks take and others don't"),
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


@dataclass
class Finding:
    code: str
    message: str
    site: str | None = None  # file:line where it shows

    def __str__(self):
        return f"{self.code}: {self.site + ': ' if self.site else ''}{self.message}"


@dataclass(frozen=True)
class Rule:
    """A rule: the codes it decides, the events it reads (each described in lessons/tools/doctor_events.py), and
    the decision, from the facts. alone: when it fires, the other rules are not asked (a run that never formed a
    group has nothing else to judge)."""
    codes: tuple
    reads: tuple
    decide: Callable
    alone: bool = False


@dataclass
class DoctorReport:
    findings: list[Finding] = field(default_factory=list)
    launch: LaunchResult | None = None  # what the ranks printed; .result is rank 0's RESULT
    error: str | None = None  # why the script did not run to the end, in one line (a hang: where each rank was)
    compare: list[str] = field(default_factory=list)  # --compare: the lines starting "compare:"
    compare_status: int | None = None  # 0 the same model, 1 not, 2 no comparison possible
    record: Record | None = field(default=None, repr=False)  # what the ranks recorded (lessons/tools/doctor_events.py)
    notes: list[Finding] = field(default_factory=list)  # severity 4: printed after the findings, exit status 0
    profile: list[str] = field(default_factory=list)  # --profile: the breakdown's lines and the profiler's cost
    slowdowns: list[Finding] = field(default_factory=list)  # --profile: doctor_profile.PROFILE_CODES, exit status 3
    no_profile: str | None = None  # --profile: why the run, though it ended, gave no profile (exit status 2)

    @property
    def status(self) -> int:
        """2: the script did not run to the end; 1: a finding (severity 1 to 3), or --compare's runs differ; 0: none
        of these and, under --compare, the same model; 2 too when --compare could not compare; 3: --profile found a
        slowdown (the run is right, as far as it looked, but slow)."""
        if self.error or self.no_profile:
            return 2
        if self.findings:
            return 1
        if self.slowdowns:
            return 3
        return self.compare_status or 0

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def __str__(self):
        if self.profile or self.no_profile:
            return "\n".join(self.profile + [str(f) for f in self.slowdowns] + (
                [f"the script did not run to the end: {self.error}"] if self.error else
                [f"no profile: {self.no_profile}"] if self.no_profile else
                [] if self.slowdowns else
                ["no slowdowns found that stand clear of this run's noise"
                 if any(line.startswith("can't judge") for line in self.profile) else "no slowdowns found"]))
        lines = [str(f) for f in self.findings]
        if self.error:
            lines.append(f"the script did not run to the end: {self.error}")
        if not lines and self.notes:  # never "no findings" above what was found: a quick reader stops there
            codes = ", ".join(dict.fromkeys(note.code for note in self.notes))
            lines.append(f"{len(self.notes)} note{'s' if len(self.notes) > 1 else ''} ({codes}) and no other"
                         " finding: a note is right here and wrong elsewhere, or slightly off; the exit status stays 0")
        if not lines:
            lines.append("no findings")
        return "\n".join(lines + [f"note: {note}" for note in self.notes] + self.compare)
