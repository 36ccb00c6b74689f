"""The DDP doctor: run any script under torchrun with instruments in every rank, and report the classic mistakes.

    lessons.doctor("train.py", nproc=2, args=["--epochs", "2"])
    python -m lessons doctor train.py -n 2 -- --epochs 2
    python -m lessons doctor train.py -n 2 --compare -- --epochs 2     # N ranks == one process with their batch?

The script is not changed: lessons/tools/doctor_site/sitecustomize.py is put first on the ranks' PYTHONPATH, and Python
loads it into each rank before the script. Each rank writes what it did to a file in a temporary directory; after
the launch the doctor compares the ranks and prints one line per finding, most serious first, each starting with a
stable code and the file:line where it shows.
Exit status (``report.status``, and the command's): 0 nothing found, 1 something found, 2 the script did not run to
the end (it crashed, hung, or can't be run; the findings that explain it are still listed). Notes (severity 4) leave
it 0. With --compare, a finding still makes it 1; without one it is the comparison's: 0 the same model, 1 not, 2 no
comparison was possible.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .launch import LaunchError, LaunchResult, torchrun

SITE_DIR = Path(__file__).resolve().parent / "doctor_site"
SITE_FILE = SITE_DIR / "sitecustomize.py"  # the instruments: loaded into every rank by Python itself


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
COMPARE_RTOL = 1e-4  # N ranks against one process: other summation orders, amplified over the steps (lesson 04)
LOW_PRECISION = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}  # a unit roundoff: autocast's steps round to it
SAME_SAMPLES = 0.5  # ranks sharing more than half their samples in a pass: no sharding, not a padded shard
USAGE = ("python -m lessons doctor SCRIPT -n N [--timeout S] [--compare [--one-process-env NAME=VALUE]"
         " [--one-process-cwd DIR]] [--nodes K] [-- ARGS]")


@dataclass
class Finding:
    code: str
    message: str
    site: str | None = None  # file:line where it shows

    def __str__(self):
        return f"{self.code}: {self.site + ': ' if self.site else ''}{self.message}"


@dataclass
class DoctorReport:
    findings: list[Finding] = field(default_factory=list)
    launch: LaunchResult | None = None  # what the ranks printed; .result is rank 0's RESULT
    error: str | None = None  # why the script did not run to the end, in one line (a hang: where each rank was)
    compare: list[str] = field(default_factory=list)  # --compare: the lines starting "compare:"
    compare_status: int | None = None  # 0 the same model, 1 not, 2 no comparison possible
    record: Record | None = field(default=None, repr=False)  # what the ranks recorded (lessons/tools/doctor_events.py)
    notes: list[Finding] = field(default_factory=list)  # severity 4: printed after the findings, exit status 0

    @property
    def status(self) -> int:
        """2: the script did not run to the end; 1: a finding (severity 1 to 3), or --compare's runs differ; 0: none
        of these and, under --compare, the same model; 2 too when --compare could not compare."""
        if self.error:
            return 2
        if self.findings:
            return 1
        return self.compare_status or 0

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def __str__(self):
        lines = [str(f) for f in self.findings]
        if self.error:
            lines.append(f"the script did not run to the end: {self.error}")
        if not lines:
            lines.append("no findings")
        return "\n".join(lines + [f"note: {note}" for note in self.notes] + self.compare)


@dataclass
class Record:
    """What the ranks wrote: their events, and their parameters at exit."""
    events: dict[int, list[dict]]
    params: dict[int, dict]
    errors: dict[int, str]  # the instruments' own failures, by rank


def doctor(script: str | os.PathLike, nproc: int = 2, args: tuple | list = (), timeout: float | None = 300,
           show: bool = False, env: dict[str, str] | None = None, compare: bool = False,
           nodes: int = 1, one_process_env: dict[str, str] | None = None,
           one_process_cwd: str | os.PathLike | None = None) -> DoctorReport:
    """Launch SCRIPT under torchrun with NPROC ranks (on each of NODES nodes), instrumented, and return the
    findings (print it to read it). compare=True also runs it as one process with the ranks' batch and compares
    the trained parameters; one_process_env and one_process_cwd give that run its own environment variables and
    working folder (a trainer that always resumes from a folder it is given)."""
    if not Path(script).is_file():
        return DoctorReport(error=f"no such script: {script}")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= 4:
        return DoctorReport(error=f"nodes must be 1 to 4 (torchrun agents on this machine), got {nodes!r}")
    if compare and nodes > 1:
        return DoctorReport(error="--compare runs one node against one process: leave out --nodes")
    if (one_process_env or one_process_cwd) and not compare:
        return DoctorReport(error="--one-process-env and --one-process-cwd set up --compare's one process: add"
                                  " --compare")
    if one_process_cwd is not None and not Path(one_process_cwd).is_dir():
        return DoctorReport(error=f"--one-process-cwd: no such folder: {one_process_cwd}")
    if not SITE_FILE.is_file():  # an install without the instruments would see nothing, and say so
        return DoctorReport(error=f"the doctor's instruments are missing from this install ({SITE_FILE}):"
                                  " reinstall the package (pip install --force-reinstall ddp-lessons)")
    started = time.time()  # --compare: a file modified since was written by this run
    report, record = _run(script, nproc, args, timeout, show, env, nodes, {"LESSONS_DOCTOR_COMPARE": "1"}
                          if compare else {})
    report.record = record
    if record is not None:
        failed = getattr(report, "failed_rank", None)
        found = examine_record(record, nproc * nodes, crashed=report.error is not None,
                               failed=set() if failed is None else {failed})
        found += _device_from_global_rank(script) if nproc * nodes > 1 else []
        report.findings = [f for f in found if CODES[f.code].severity < NOTE]
        report.notes = [f for f in found if CODES[f.code].severity == NOTE]
    if compare:
        alone = {"env": {**(env or {}), **(one_process_env or {})}, "cwd": one_process_cwd}
        report.compare, report.compare_status = _compare(script, nproc, args, timeout, alone, report, record,
                                                         started)
    return report


def _run(script, nproc, args, timeout, show, env, nodes, extra_env, cwd=None) -> tuple[DoctorReport, Record | None]:
    """One instrumented launch; the report's error, and what the ranks recorded."""
    from .nodes import torchrun_nodes  # lessons.tools.nodes imports lessons.tools.launch: imported when needed

    with tempfile.TemporaryDirectory(prefix="ddp_doctor_") as out_dir:
        python_path = os.pathsep.join(p for p in (str(SITE_DIR), (env or {}).get("PYTHONPATH",
                                                  os.environ.get("PYTHONPATH", ""))) if p)
        launch_env = {**(env or {}), **extra_env, "PYTHONPATH": python_path, "LESSONS_DOCTOR_DIR": out_dir}
        launch_env.pop("LESSONS_DOCTOR_RANK_PID", None)
        report = DoctorReport()
        try:
            if nodes > 1:
                launched = torchrun_nodes(script, nnodes=nodes, nproc_per_node=nproc, args=list(args),
                                          timeout=timeout, show=show, env=launch_env)
                report.launch = launched.nodes[0]
            else:
                report.launch = torchrun(Path(script).resolve() if cwd else script, nproc=nproc,
                                         args=[str(a) for a in args], timeout=timeout, show=show, env=launch_env,
                                         live=False, cwd=cwd)
        except LaunchError as error:
            report.launch = error.result
            report.error = _why_it_stopped(error)
            report.failed_rank = error.rank
        except (ValueError, TypeError, FileNotFoundError) as error:  # bad arguments (nproc, timeout): one line
            return DoctorReport(error=str(error)), None
        record = read_record(Path(out_dir), nproc * nodes)
    unseen = [rank for rank, events in record.events.items() if not any(e["event"] == "start" for e in events)]
    refused = _torchrun_refused(report.launch)
    if refused:  # torchrun's own argument error: no rank started
        return DoctorReport(launch=report.launch, error=refused), None
    if unseen:  # never "no findings" about a rank it did not see
        return DoctorReport(launch=report.launch, error=report.error or (
            f"the doctor did not see rank {unseen[0]}: its instruments did not load there ({SITE_FILE.name} from"
            f" {SITE_DIR} first on PYTHONPATH; python -E or -I ignores it), so it can't say what the run did")), None
    if record.errors:  # the instruments failed in a rank: what it recorded is not the whole story
        rank, why = min(record.errors.items())
        report.error = f"the doctor's instruments failed in rank {rank} (please report it): {why}"
    spawned = [e for evs in record.events.values() for e in evs if e["event"] == "spawn"]
    if spawned:
        report.error = _spawn_error(f"{spawned[0]['site']}: {spawned[0]['call']}")
    return report, record


def _torchrun_refused(launch: LaunchResult | None) -> str | None:
    """torchrun's own argparse error ("torchrun: error: ambiguous option: --log could match ..."), with what to do:
    a script's flag that is a prefix of torchrun's options is taken as torchrun's."""
    text = getattr(launch, "launcher_log", "") or ""
    line = next((l for l in text.splitlines() if re.match(r"\S+: error: ", l)), None)
    if line is None:
        return None
    hint = (": the script's flag is taken for torchrun's own (torchrun reads every option before the script's"
            " name that is a prefix of one of its own, and refuses an ambiguous one); spell the flag out in full,"
            " or give it as --flag=value") if "ambiguous option" in line else ""
    return f"torchrun refused its arguments: {line.split(': error: ', 1)[1]}{hint}"


def _spawn_error(where: str) -> str:
    place, call = where.rsplit(": ", 1)
    return (f"{place}: the script starts its own ranks ({call}), and torchrun has already started them: run it with"
            " python, or drop the spawn and read RANK, LOCAL_RANK and WORLD_SIZE from the environment (lesson 10)")


def _why_it_stopped(error: LaunchError) -> str:
    """One line for a crash (the failing rank's own file:line and error), the places of each rank for a hang."""
    message = str(error)
    if error.result is not None and error.result.stacks:  # a hang: where each rank was
        return re.sub(r" The full stacks are in \.result\.stacks, the output so far in \.result\.outputs\.", "",
                      message)
    if error.rank is not None and error.result is not None:
        stderr = error.result.stderr.get(error.rank, "")
        frames = re.findall(r'File "([^"]+)", line (\d+)', stderr)
        own = [(f, n) for f, n in frames if "site-packages" not in f and "/torch/" not in f
               and "doctor_site" not in f and not f.startswith("<")]
        where = own[-1] if own else frames[-1] if frames else None
        if where:
            return (f"rank {error.rank} failed at {_shown_path(where[0])}:{where[1]}:"
                    f" {error.root_cause or message.splitlines()[0]}")
    return error.root_cause or message.splitlines()[0]


def _shown_path(name: str) -> str:
    """As the ranks show their sites (doctor_site/sitecustomize.py): relative to here unless that climbs 2 folders."""
    try:
        relative = os.path.relpath(name)
    except ValueError:
        return name
    return name if relative.startswith(os.path.join("..", "..")) else relative


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


def examine(out_dir: Path, nproc: int, crashed: bool = False) -> list[Finding]:
    """The findings in what NPROC ranks wrote to OUT_DIR, most serious first."""
    return examine_record(read_record(Path(out_dir), nproc), nproc, crashed)


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


def examine_record(record: Record, nproc: int, crashed: bool = False, failed: set[int] = frozenset()) -> list[Finding]:
    """The findings in what NPROC ranks recorded; crashed: the launch failed (FAILED: the ranks whose own error it
    was, when known)."""
    events = record.events
    samplers = {rank: {e["sampler"]: e for e in evs if e["event"] == "sampler"} for rank, evs in events.items()}
    passes = {rank: passes_of(evs) for rank, evs in events.items()}
    trained = {rank: by_site(ps) for rank, ps in passes.items()}
    if nproc > 1 and not crashed and all(evs for evs in events.values()) \
            and not any(e["event"] == "init" for evs in events.values() for e in evs):
        made = _first(events, "optimizer") or _first(events, "loader")
        return [Finding("not-distributed", (
            f"no rank called init_process_group: the {nproc} processes torchrun started each ran the whole"
            " one-process script: each trains its own model on all the data, and each writes the same files."
            " Make it distributed first: the five changes of lesson 00, or ddp_scripts/template.py"),
            made["site"] if made else None)]
    found = []
    found += _separate_models(record)
    found += _collectives_differ(events, crashed)
    found += _unequal_batches(trained, passes, events, failed)
    found += _same_samples(trained, samplers, nproc, events)
    found += _datasets_differ(events)
    found += _sampler_epochs(passes, samplers)
    found += _same_random_state(events, nproc)
    found += _rank_from_local_rank(events)
    found += _saves_and_loads(events, nproc)
    found += _evaluations(passes, samplers, nproc, events)
    if not crashed:
        exits = {rank: next((e for e in evs if e["event"] == "exit"), None) for rank, evs in events.items()}
        undestroyed = [rank for rank, e in exits.items() if e and e["initialized"]]
        # Lightning and Accelerate make the group, and tear it down as they see fit (Lightning leaves a gloo
        # group to the interpreter's exit): the script has no line to change.
        by_library = any(_in_a_library(e["site"]) for evs in events.values() for e in evs if e["event"] == "init")
        if undestroyed and all(exits.values()) and not by_library:
            found.append(Finding("no-destroy", (
                f"rank(s) {', '.join(map(str, undestroyed))} exited with the process group never destroyed; end with"
                " dist.destroy_process_group(), or the exit can hang or abort (lesson 00)")))
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
            if combined and repeated and not any(f.code == "padded-evaluation" for f in found):
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


def _collective_after(events, p) -> bool:
    """Did the script make a collective after pass P's last batch, before the next optimizer step (or the end)?"""
    last = max((i for i, e in enumerate(events) if e["event"] in ("batch", "pass_end")
                and e.get("loader") == p.loader["loader"] and e.get("number") == p.number), default=None)
    if last is None:
        return False
    steps = events[last].get("steps", 0)
    for e in events[last + 1:]:
        if e["event"] == "collective":
            return True
        if e.get("steps", steps) > steps:
            return False
    return False


def _device_from_global_rank(script) -> list[Finding]:
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


def _first(events, kind):
    return next((e for evs in events.values() for e in evs if e["event"] == kind), None)


def _separate_models(record: Record) -> list[Finding]:
    """The ranks' parameters at exit, each optimizer's and each DDP module's, compared with rank 0's. Only a model's
    parameters are compared: the instruments name what each parameter is (doctor_site: "opt" a model's parameter;
    "flat" and "own", an FSDP shard or a tensor of the rank's own, are left out, as DTensors are)."""
    params = record.params
    if len(params) < 2:
        return []
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
    states = {e.get("rng_first_step") for e in exits}
    if len(states) != 1 or None in states:
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
        one_env["LESSONS_DOCTOR_BATCHES"] = json.dumps({"site": site, "passes": passes})
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
    single, single_record = _run(script, 1, one_args, timeout, False, alone.get("env"), 1, one_env,
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
    lines = [batch_line]
    ranks_params = _assembled(record)
    one_params = single_record.params.get(0, {})
    names = sorted(n for n in ranks_params if n.startswith(("opt", "flat.")))
    if not names or names != sorted(n for n in one_params if n.startswith(("opt", "flat."))):
        return cannot("the optimizers' parameters of the two runs don't match up (another model or optimizer on"
                      " one process, or parameters sharded in a way the doctor can't put together: DTensors)", lines)
    for n in names:
        if n.startswith("flat."):  # the one process's flat parameter is unpadded: the ranks' shards end in padding
            ranks_params[n] = ranks_params[n][:one_params[n].numel()]
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
                     " runs can differ without a mistake; switch them off to compare (model.eval() for dropout)")
    return lines, 0 if same else 1


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
    """The reference rank's parameters, each FSDP flat parameter put together from the ranks' shards (rank order)."""
    import torch

    reference = dict(record.params.get(min(record.events), {}))
    for name in [n for n in reference if n.startswith("flat.")]:
        reference[name] = torch.cat([record.params[rank][name] for rank in sorted(record.params)
                                     if name in record.params[rank]])
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
    whole, compared = per_rank * nproc, 0
    for number, single in enumerate(one):
        mine = [ps[number].indices for ps in ranks.values() if number < len(ps)]
        if len(mine) < nproc:
            break
        steps = min(len(single.indices) // whole, min(len(m) for m in mine) // per_rank) - 1
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
    return (f"at each of {compared} steps compared the one process drew the union of the ranks' samples (the last"
            " step of each pass left out: a DistributedSampler pads it)"), True


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


# --- The command line -------------------------------------------------------------------------------------------

def main(argv: list[str]) -> int:
    """The command line: USAGE."""
    import argparse
    import sys

    own, script_args = argv, []
    if "--" in argv:
        cut = argv.index("--")
        own, script_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(
        prog="python -m lessons doctor", usage=USAGE,
        description="Run SCRIPT under torchrun with the DDP doctor's instruments, and report the classic DDP"
                    " mistakes it made, each with its file:line. Exit status: 0 nothing found (notes aside), 1"
                    " something found, 2 the script did not run to the end; with --compare and no finding, 0 the"
                    " same model, 1 not, 2 no comparison.",
        epilog="The script's own arguments go after --, e.g. python -m lessons doctor train.py -n 2 -- --epochs 2")
    parser.add_argument("script", help="the training script, as you would give it to torchrun")
    parser.add_argument("-n", "--nproc", type=int, default=2, help="ranks (per node), default 2")
    parser.add_argument("--timeout", type=float, default=300, help="seconds for the launch; 0 for none")
    parser.add_argument("--compare", action="store_true",
                        help="also run it as one process with the ranks' batch, and compare the trained parameters")
    parser.add_argument("--nodes", type=int, default=1, help="torchrun agents on this machine, as K nodes would")
    parser.add_argument("--one-process-env", action="append", default=[], metavar="NAME=VALUE",
                        help="--compare: an environment variable for the one process only (a trainer that resumes"
                             " from a folder named in the environment); repeat it for several")
    parser.add_argument("--one-process-cwd", metavar="DIR",
                        help="--compare: the one process's working folder (relative paths of its own)")
    options, unknown = parser.parse_known_args(own)
    if unknown:
        print(f"doctor: {' '.join(unknown)} is not the doctor's: the script's own arguments go after --, as in"
              f" python -m lessons doctor {options.script} -n {options.nproc} -- {' '.join(unknown)}",
              file=sys.stderr)
        return 2
    malformed = [item for item in options.one_process_env if "=" not in item or item.startswith("=")]
    if malformed:
        print(f"doctor: --one-process-env {malformed[0]}: give NAME=VALUE", file=sys.stderr)
        return 2
    report = doctor(options.script, nproc=options.nproc, args=script_args, timeout=options.timeout or None,
                    compare=options.compare, nodes=options.nodes,
                    one_process_env=dict(item.split("=", 1) for item in options.one_process_env),
                    one_process_cwd=options.one_process_cwd)
    print(report)
    return report.status


def console() -> int:
    """The ddp-doctor command (pyproject.toml's [project.scripts])."""
    import sys
    return main(sys.argv[1:])
