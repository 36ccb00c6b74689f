"""Check an exercise on real ranks: ``python -m lessons check NAME [PATH]`` (or ``ddp-check``, or the older
``python -m lessons check``), or ``lessons.check("NAME")`` in a cell.

The check launches a course-owned script (lessons/tools/exercise_checks/NAME.py) under torchrun, which imports the
learner's file by path and runs it at sizes the learner did not try, measuring what it does. The first line
printed is ``PASS NAME`` or ``FAIL NAME: <what is wrong>``; details follow. Exit status: 0 pass, 1 fail,
2 bad usage (an unknown exercise, a missing file).
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from .failure import LaunchError
from .launch import torchrun
from .rank_output import PEER_FAILURE
from .stacks import where

ROOT = Path(__file__).resolve().parents[2]
# The learner's files: the checkout's exercises/ (make lab), or, where the tools are installed into another
# project, exercises/ under the folder the check runs from (any other path is given: ddp-check NAME PATH).
EXERCISES_DIR = ROOT / "exercises" if (ROOT / "exercises").is_dir() else Path("exercises")
CHECKS_DIR = Path(__file__).resolve().parent / "exercise_checks"
HANG_TIMEOUT_S = 30.0  # after every rank has started: a correct answer takes a few seconds
FAIL_PREFIX, CASE_PREFIX, START_LINE = "EXERCISE FAIL ", "EXERCISE CASE ", "EXERCISE START"


@dataclass(frozen=True)
class Exercise:
    lesson: str
    nproc: int  # the launch's ranks: the largest world the check forms
    what: str  # the functions (or file) the learner's file must define
    functions: tuple[str, ...] = ()  # the names the learner's file must define at its top level
    defines: str = ""  # exercises/README.md's table: what the learner's file defines (markdown)
    checked_at: str = ""  # and the sizes and cases the check runs it at
    timeout: float = HANG_TIMEOUT_S  # seconds after every rank has started: then it is a hang
    before_launch: str = ""  # a script of exercise_checks/ that reads the learner's file first: its output is the hint


EXERCISES = {  # exercises/README.md's table is made from these (python -m lessons.course --write)
    "ring_allreduce": Exercise(
        "02b_ring_allreduce_from_scratch", 5, "ring_all_reduce(tensor) -> None", ("ring_all_reduce",),
        defines="`ring_all_reduce(tensor) -> None`: an in-place sum with send/recv only",
        checked_at="2, 3, 5 ranks; lengths 1, N−1, N+1, odd; float32, float64; bytes sent counted"),
    "average_gradients": Exercise(
        "03_ddp_from_scratch", 3, "average_gradients(model) -> None", ("average_gradients",),
        defines="`average_gradients(model) -> None`, called after `backward()`",
        checked_at="3 ranks, 3 steps, against torch's DDP; tied and frozen parameters"),
    "convert_to_ddp": Exercise(
        "04_ddp_training", 3, "a training script run by torchrun",
        defines="a copy of `single_process_train.py` that runs under torchrun",
        checked_at="2, 3 ranks: final parameters equal the single-process run's"),
    "unpadded_eval": Exercise(
        "05_distributed_sampler", 4, "evaluate(model, dataset, batch_size) -> float", ("evaluate",),
        defines="`evaluate(model, dataset, batch_size) -> float`",
        checked_at="2, 3, 4 ranks; 1, 10, 11, 13 samples; every sample counted once"),
    "resume": Exercise(
        "07_checkpoints", 3, "save_checkpoint(...), load_checkpoint(...) -> (epoch, step), train_loop(...)",
        ("save_checkpoint", "load_checkpoint", "train_loop"),
        defines="`save_checkpoint(path, ddp_model, optimizer, epoch, step)`, `load_checkpoint(path, ddp_model, "
                "optimizer) -> (epoch, step)`, `train_loop(ddp_model, optimizer, sampler, loader, epochs, path, "
                "train_step)`",
        checked_at="2, 3 ranks: the resumed run hashes like the uninterrupted one; your loop, stopped mid-epoch and "
                   "resumed, trains every batch once, in order"),
    "no_sync": Exercise(
        "09_gradient_accumulation", 3, "train_step(ddp_model, optimizer, micro_batches, loss_fn) -> float",
        ("train_step",),
        defines="`train_step(ddp_model, optimizer, micro_batches, loss_fn) -> float`",
        checked_at="3 ranks, k = 1 and 3, and micro-batches of 5 and 3 samples: one all-reduce per step, the big "
                   "batch's gradient"),
    # Six tiny scripts run in a second once started: a hang is called sooner.
    "find_the_hang": Exercise(
        "11_debugging", 3, "a folder of fixed scripts", timeout=10.0,
        defines="fixed copies of the three scripts in `find_the_hang/`",
        checked_at="3 ranks: each finishes, with the reference's `RESULT`"),
    "tensor_parallel": Exercise(
        "15_beyond_ddp_device_mesh", 4, "plan(block) -> {name: ParallelStyle}", ("plan",),
        defines="`plan(block) -> {name: ParallelStyle}` for a gated MLP",
        checked_at="2, 4 ranks: output and gradients equal one process's, one all-reduce per forward"),
    "pipeline_schedule": Exercise(
        "15b_pipeline_parallelism", 4, "one_f_one_b(stage, num_stages, microbatches) -> [(kind, m), ...]",
        ("one_f_one_b",),
        defines="`one_f_one_b(stage, num_stages, microbatches) -> list`: one stage's 1F1B order of forwards and "
                "backwards",
        checked_at="2, 3, 4, 5, 8 stages, and fewer micro-batches than stages: read before a launch (deadlock, "
                   "order, memory, length against 1F1B's), then run on real ranks against one process at 2, 3, 4 "
                   "stages",
        before_launch="pipeline_orders.py"),  # the orders alone name most mistakes: a second, not a launch
    "ring_attention": Exercise(
        "15c_context_parallelism", 4, "merge(out_a, lse_a, out_b, lse_b) -> (out, lse), ring_attention(q, k, v, causal)",
        ("merge", "ring_attention"),
        defines="`merge(out_a, lse_a, out_b, lse_b) -> (out, lse)`: the log-sum-exp merge, and "
                "`ring_attention(q, k, v, causal) -> out`: K/V blocks passed around the ring",
        checked_at="merge of two and three blocks; 2, 3, 4 ranks, 3 and 5 tokens a rank, causal and not, against "
                   "one process's attention"),
    "moe_dispatch": Exercise(
        "15d_expert_parallelism", 4, "dispatch(tokens, expert_of_token, num_experts, capacity), combine(...)",
        ("dispatch", "combine"),
        defines="`dispatch(tokens, expert_of_token, num_experts, capacity) -> (received, expert_of_received, "
                "routing)` and `combine(expert_outputs, routing, tokens, weight_of_token) -> output`: tokens to "
                "their experts' ranks and back with `all_to_all_single`",
        checked_at="2, 3, 4 ranks; 1 and 2 experts a rank; full experts, a rank sending nothing to most: the split "
                   "sizes agree, every kept token arrives once, none dropped, the output equals one process's"),
}


class UsageError(ValueError):
    """Bad usage: an unknown exercise or a missing file (exit status 2)."""


@dataclass
class CheckResult:
    name: str
    passed: bool
    lines: list[str] = field(default_factory=list)  # what was printed, the verdict first

    def __bool__(self):
        return self.passed

    def _ipython_display_(self):  # the check has printed its verdict; a cell shows nothing more
        pass


def default_path(name: str) -> Path:
    return EXERCISES_DIR / name if name == "find_the_hang" else EXERCISES_DIR / f"{name}.py"


def check(name: str, path: str | os.PathLike | None = None, *, env: dict[str, str] | None = None,
          timeout: float | None = None, show: bool = True) -> CheckResult:
    """Run exercise NAME's check on the learner's file (by default exercises/NAME.py); print the verdict.

    ``timeout``: seconds a launch may run once every rank has started (a hang is stopped then); by default
    30 s, 10 s for find_the_hang.
    ``env``: extra environment for the launch (the tests mark their processes with it)."""
    if name not in EXERCISES:
        raise UsageError(f"unknown exercise {name!r}: one of {', '.join(EXERCISES)}")
    path = Path(path) if path is not None else default_path(name)
    if name == "find_the_hang" and not path.is_dir():
        raise UsageError(f"find_the_hang checks a folder of scripts (like exercises/find_the_hang), "
                         f"and {path} is not one")
    if name != "find_the_hang" and not path.is_file():
        raise UsageError(f"no such file: {path} (cwd is {os.getcwd()})")
    problem = _before_launch(name, path)
    if problem:
        lines = [f"FAIL {name}: {problem}"]
    else:
        lines = _run(name, path.resolve(), env, timeout or EXERCISES[name].timeout)
    if show:
        print("\n".join(lines), flush=True)
    return CheckResult(name, lines[0].startswith("PASS"), lines)


FIND_THE_HANG_SCRIPTS = ("rank_conditional.py", "early_stop.py", "shape_mismatch.py")


def _before_launch(name: str, path: Path) -> str | None:
    """What fails without a launch (a second instead of ten): a missing script, a syntax error, a missing name.
    Only whether the names exist is read from the source; everything they do is run and measured."""
    if name == "find_the_hang":
        missing = [s for s in FIND_THE_HANG_SCRIPTS if not (path / s).is_file()]
        if missing:
            return (f"{path} has no {', '.join(missing)}: the check runs your fixed copies of the scripts of "
                    "exercises/find_the_hang/, from a folder that holds all three")
        files = [path / s for s in FIND_THE_HANG_SCRIPTS]
    else:
        files = [path]
    for file in files:
        try:
            tree = ast.parse(file.read_text(), filename=str(file))
        except SyntaxError as error:
            return f"{file.name} has a syntax error at line {error.lineno}: {error.msg}"
    missing = [f for f in EXERCISES[name].functions if f not in _top_level_names(tree.body)]
    if missing:
        return (f"{path.name} defines no function {', '.join(missing)}: the exercise asks for "
                + ", ".join(f"{f}()" for f in missing))
    if EXERCISES[name].before_launch:  # in a process of its own: the learner's code runs there, not here
        read = subprocess.run([sys.executable, str(CHECKS_DIR / EXERCISES[name].before_launch), str(path)],
                              capture_output=True, text=True, timeout=60)
        return read.stdout.strip() or (read.stderr.strip().splitlines() or [None])[-1]
    return None


def _top_level_names(body) -> set[str]:
    """Names a module binds outside its functions and classes (def, class, import, assignment; in if/try too)."""
    names = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        for child in ast.walk(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(child.name)
            elif isinstance(child, ast.alias):
                names.add((child.asname or child.name).split(".")[0])
            elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                names.add(child.id)
    return names


def _run(name: str, path: Path, env, timeout) -> list[str]:
    exercise = EXERCISES[name]
    harness = CHECKS_DIR / f"{name}.py"
    try:
        with tempfile.TemporaryDirectory(prefix="ddp_lessons_check_") as workdir:  # checkpoints, --out files
            launch = torchrun(harness, nproc=exercise.nproc, args=[str(path), workdir], timeout=timeout, show=False,
                              env=env, live=False, timeout_from=START_LINE)
    except LaunchError as error:
        return _explain(name, path, error, timeout)
    result = launch.result or {}
    if not result.get("passed"):  # the harness reports every pass; without one, something went wrong
        return [f"FAIL {name}: the check ended without a verdict", *_tail(launch.outputs)]
    return [f"PASS {name}", f"checked: {result['summary']}"]


def check_several(name: str, paths: list, *, env: dict[str, str] | None = None,
                  timeout: float | None = None) -> list[CheckResult]:
    """check() on several answers to NAME, the launches shared: check_exercises({NAME: paths})."""
    return check_exercises({name: paths}, env=env, timeout=timeout)[name]


def check_exercises(answers: dict, *, env: dict[str, str] | None = None,
                    timeout: float | None = None) -> dict[str, list[CheckResult]]:
    """check() on every answer of ``answers`` ({exercise: [path, ...]}), the launches shared: the exercises whose
    checks launch as many ranks share ONE launch, which runs each answer's check in turn, each in a process forked
    from every rank (exercise_checks/several.py), and each verdict is made from that answer's output as check()
    makes it from a launch's. For the tests, which check many wrong answers; a hang is named, without the ranks'
    stacks. Nothing is printed."""
    answers = {name: [Path(p) for p in paths] for name, paths in answers.items()}
    verdicts, launches = {}, {}  # launches: nproc -> [(name, index, path, timeout)]
    for name, paths in answers.items():
        for i, path in enumerate(paths):
            if problem := _before_launch(name, path):
                verdicts[name, i] = [f"FAIL {name}: {problem}"]
            else:
                launches.setdefault(EXERCISES[name].nproc, []).append(
                    (name, i, path.resolve(), timeout or EXERCISES[name].timeout))
    for nproc, launched in launches.items():
        with tempfile.TemporaryDirectory(prefix="ddp_lessons_check_") as workdir:
            torchrun(CHECKS_DIR / "several.py", nproc=nproc, show=False, env=env, live=False,
                     args=[workdir, *(arg for name, _, path, seconds in launched for arg in (name, seconds, path))],
                     timeout=sum(seconds + 30 for *_, seconds in launched), timeout_from=START_LINE)
            for index, (name, i, path, seconds) in enumerate(launched):
                verdicts[name, i] = _verdict_of_answer(name, path, Path(workdir) / f"answer_{index}", nproc, seconds)
    return {name: [CheckResult(name, verdicts[name, i][0].startswith("PASS"), verdicts[name, i])
                   for i in range(len(paths))] for name, paths in answers.items()}


def _answer_ended(message, rank, root_cause, outputs) -> LaunchError:
    """How one answer of several.py's launch ended, as the error of a launch of its own (what _explain reads)."""
    return LaunchError(message, SimpleNamespace(outputs=outputs, stacks={}), rank, root_cause)


def _verdict_of_answer(name: str, path: Path, out: Path, nproc: int, timeout: float) -> list[str]:
    outputs = {r: (out / f"rank_{r}.txt").read_text() if (out / f"rank_{r}.txt").exists() else ""
               for r in range(nproc)}
    ends = {r: json.loads((out / f"rank_{r}.json").read_text()) for r in range(nproc)}
    failed = sorted((e["ended"], r) for r, e in ends.items() if e["code"] not in (0, None))
    if any(e["timed_out"] for e in ends.values()) and not failed:
        return _explain(name, path, _answer_ended(f"timed out after {timeout:g} s", None, "", outputs), timeout)
    if failed:
        rank = failed[0][1]
        code = ends[rank]["code"]
        how = f"exitcode: {code}" if code > 0 else f"signal: {-code}"
        lines = outputs[rank].strip().splitlines()
        return _explain(name, path, _answer_ended(f"rank {rank} failed ({how})\n" + "\n".join(lines[-10:]), rank,
                                                 lines[-1] if lines else "", outputs), timeout)
    results = [ln for ln in outputs[0].splitlines() if ln.startswith("RESULT ")]
    result = json.loads(results[-1][len("RESULT "):]) if results else {}
    if not result.get("passed"):
        return [f"FAIL {name}: the check ended without a verdict", *_tail(outputs)]
    return [f"PASS {name}", f"checked: {result['summary']}"]


def _explain(name: str, path: Path, error: LaunchError, timeout: float) -> list[str]:
    launch = error.result
    outputs = launch.outputs if launch else {}
    failures = []
    for rank, text in outputs.items():
        for line in text.splitlines():
            if line.startswith(FAIL_PREFIX):
                failures.append(json.loads(line[len(FAIL_PREFIX):]))
    own = [f for f in failures if not PEER_FAILURE.search(f["hint"])]
    # A rank that only lost its peer (because another rank failed first) is not the news; a rank that crashed
    # without a word (a signal, e.g. gloo's abort on a size mismatch) is.
    crashed = error.rank is not None and error.rank not in {f["rank"] for f in failures}
    if own or (failures and not crashed):
        first = min(own or failures, key=lambda f: f["rank"])
        return [f"FAIL {name}: {first['hint']}", *([first["detail"]] if first["detail"] else []),
                *_learner_traceback(outputs.get(first["rank"], ""), path)]
    case = _last_case(outputs)
    if launch is not None and launch.stacks or "timed out" in str(error):
        places = [f"  rank {rank}: {where(dump, _script_of(name, path, outputs.get(rank, '')))}"
                  for rank, dump in sorted((launch.stacks if launch else {}).items())]
        if "did not" in str(error).splitlines()[0]:  # a rank never got to the start line
            return [f"FAIL {name}: the check's ranks did not start: {str(error).splitlines()[0]}", *places]
        return [f"FAIL {name}: it hangs: no result within {timeout:g} s" + (f", while checking {case}" if case else "")
                + ". Where each rank was:", *places]
    how = re.search(r" failed(?: in attempt \d+)? \(([^)]*)\)", str(error).splitlines()[0])
    return [f"FAIL {name}: rank {error.rank} crashed" + (f" ({how.group(1)})" if how else "")
            + (f" while checking {case}" if case else "") + f": {(error.root_cause or '').strip()}",
            *str(error).splitlines()[1:12]]


def _last_case(outputs: dict[int, str]) -> str:
    lines = [ln for ln in outputs.get(0, "").splitlines() if ln.startswith(CASE_PREFIX)]
    return lines[-1][len(CASE_PREFIX):] if lines else ""


def _script_of(name: str, path: Path, output: str) -> str:
    """The learner's file a rank was running (find_the_hang runs several in turn)."""
    if name != "find_the_hang":
        return path.name
    running = [ln for ln in output.splitlines() if ln.startswith(CASE_PREFIX)]
    return running[-1][len(CASE_PREFIX):].split()[0] if running else path.name


def _learner_traceback(output: str, path: Path) -> list[str]:
    """The rank's traceback, cut to the learner's own frames and the error (not the check's, not torch's)."""
    start = output.rfind("Traceback (most recent call last)")
    if start < 0:
        return []
    lines = [ln for ln in output[start:].splitlines() if not ln.startswith(FAIL_PREFIX)]
    folder = str(path if path.is_dir() else path.parent)
    kept, keep_code = ["Traceback (most recent call last), your code's frames:"], False
    for line in lines[1:]:
        if line.startswith('  File "'):
            keep_code = line.startswith(f'  File "{folder}')
            if keep_code:
                kept.append(line)
        elif line.startswith("    "):
            if keep_code and not set(line.strip()) <= set("^~ "):
                kept.append(line)
        else:
            kept.append(line)  # the exception itself
    return kept


def _tail(outputs: dict[int, str]) -> list[str]:
    return [f"rank {r}: {ln}" for r, text in outputs.items() for ln in text.strip().splitlines()[-5:]]


USAGE = "python -m lessons check NAME [PATH]"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not 1 <= len(argv) <= 2 or argv[0] in ("-h", "--help"):
        exercises = "".join(f"\n    {n:<18} lesson {e.lesson.split('_')[0]}: {e.what}" for n, e in EXERCISES.items())
        print(f"usage: {USAGE}\n  NAME: one of{exercises}\n"
              "  PATH: the file to check (default exercises/NAME.py; for find_the_hang a folder)", file=sys.stderr)
        return 2
    try:
        result = check(argv[0], argv[1] if len(argv) == 2 else None)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0 if result.passed else 1


def console() -> int:
    """The ddp-check command (pyproject.toml's [project.scripts]); python -m lessons check is the same."""
    return main()


if __name__ == "__main__":
    sys.exit(main())
