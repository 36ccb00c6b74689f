"""The DDP doctor (lessons/tools/doctor.py): each code fires on its planted mistake, and is silent on correct code.

Real launches: tests/scripts/doctor/mistakes_then_crash.py (five mistakes, then a crash: exit 2, the failing rank's
file:line, no finding invented from the crash); tests/scripts/doctor/data_mistakes.py with data mistakes planted,
and under --compare, where its correct version (with what a careless tool takes for mistakes) must give no finding.
Lesson 14b runs its own scripts (the classic mistakes and their fixes, separate models, --compare on a correct and on
a summed loss, --nodes 2 on LOCAL_RANK mistakes): those launches are not repeated here. Each code alone is also checked on what
two ranks record, without a launch.
"""
import json
import os
import re
import subprocess
import sys

import pytest

import lessons
from conftest import FIXTURES, ROOT
from lessons.tools.doctor import CODES, NOTE, SITE_DIR, USAGE, examine
from lessons.tools.doctor_profile import PROFILE_CODES

CRASH = FIXTURES / "doctor" / "mistakes_then_crash.py"
DATA = FIXTURES / "doctor" / "data_mistakes.py"


def at(script, text):
    """script:line, as the doctor shows it from the repository's root, of the first line of SCRIPT holding TEXT: a
    fixture's line found by what it says, so an edit above it breaks no test."""
    number = next(n for n, line in enumerate(script.read_text().splitlines(), 1) if text in line)
    return f"{script.relative_to(ROOT)}:{number}"


def doctor_command(*args, env=None):
    return subprocess.run([sys.executable, "-m", "lessons", "doctor", *map(str, args)], cwd=ROOT, text=True,
                          capture_output=True, env={**os.environ, **(env or {})}, timeout=300)


def codes_of(stdout):
    return [line.split(":", 1)[0] for line in stdout.splitlines() if line.split(":", 1)[0] in CODES]


def recorded(title):
    """The doctor's report, decided again from the recorded corpus case whose title is TITLE (tests/doctor_corpus/,
    benchmarks/doctor_corpus.py --record-to): the rules on a real launch's events, without the launch."""
    from lessons.tools.doctor import replay
    case = next((p.parent for p in (ROOT / "tests" / "doctor_corpus").glob("*/case.json")
                 if json.loads(p.read_text())["title"] == title), None)
    assert case is not None, f"no recorded case {title!r}: re-record the corpus (tests/test_doctor_corpus.py)"
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        report = replay(case)
    finally:
        os.chdir(here)
    return report.status, str(report)


def test_mistakes_then_a_crash():
    status, text = recorded("tests/scripts/doctor/mistakes_then_crash.py {tmp}/ckpt.pt")
    assert status == 2, text  # it crashed: 2, whatever was found before
    assert codes_of(text) == ["collectives-differ", "params-diverged", "no-set-epoch", "save-on-every-rank",
                              "weights-only-off"], text  # most serious first; no no-destroy
    assert f"no-set-epoch: {at(CRASH, 'sampler = DistributedSampler(')}: " in text  # the sampler's own line
    assert re.search(r"ranks 0, 1 all called torch.save\('[^']*ckpt.pt'\)", text), text
    assert "largest difference 0.5 (rank 1 vs rank 0, parameter weight)" in text
    assert "part at call #5: rank 0 called all_reduce on a float32 tensor of shape (3,)" in text  # Join's own
    assert "rank 1 called all_reduce on a float32 tensor of shape (2,)" in text  # all-reduces are not counted
    assert "load-without-map-location" not in text  # the file holds CPU tensors: map_location changes nothing
    assert f"the script did not run to the end: rank 0 failed at {at(CRASH, 'dist.all_reduce(torch.ones(2 if')}:" \
        in text


@pytest.mark.parametrize("title, expected, status", [
    # four that don't interfere; no-ddp with a checkpoint: rank 0's weights loaded by all, equal at exit
    ("--mistakes no-ddp,unseeded-split,sampler-per-epoch,map-location-empty --checkpoint {tmp}/ckpt.pt",
     ["separate-models", "datasets-differ", "sampler-recreated", "map-location-maps-nothing"], 1),
    ("--mistakes unequal-shards", ["unequal-batches"], 2),  # rank 1 stops a batch early, and rank 0 then fails
])
def test_data_mistakes(title, expected, status):
    found, text = recorded(f"tests/scripts/doctor/data_mistakes.py {title}")
    assert (found, codes_of(text)) == (status, expected), text
    assert all(line.split(": ", 2)[1].startswith("tests/scripts/doctor/data_mistakes.py:")
               for line in text.splitlines() if line.split(":", 1)[0] in CODES)  # each names its line


COMPARE = FIXTURES / "doctor" / "compare_cases.py"
MODELS = FIXTURES / "doctor" / "models_by_hand.py"


@pytest.mark.parametrize("script, args, status, expected", [
    # a correct script as a user would call it equivalent: FSDP1's flat shards put together; a loader with a
    # batch_sampler, whose union the one process gets; a loss divided by the per-rank --batch-size, which the one
    # process gets at N times its value; bf16 autocast, whose tolerance grows with the distance the weights travelled
    (COMPARE, ["--fsdp1", "--batch-sampler", "--loss", "sum-over-flag", "--bf16"], 0, [
        "no findings\n"
        f"compare: batch: each rank's loader (made at {at(COMPARE, 'batch_sampler=BatchSampler(')}) takes its batches from a"
        " batch_sampler (BatchSampler), 8 a step; one process was given the union of the 2 ranks' batches, step by"
        " step (16 a step), and --batch-size 16 (the script's --batch-size holds the per-rank 8)\n",
        "compare: 2 ranks and one process train the same model: largest parameter difference",
        f"compare: note: the steps ran under autocast to bfloat16 (at {at(COMPARE, 'with torch.autocast(')}): the"
        " tolerance is that precision's roundoff, 4e-03, times the weights' scale (1) and the distance they"
        " travelled ("]),
    # no sampler, in a loop that stops by counting (as Lightning's does): the passes never reach StopIteration and
    # their samples are still compared: the one process can't draw the ranks' batches, so no comparison; and a drop
    # path (timm's kind) under one seed everywhere. Findings of severity 1: exit 1 whatever the comparison.
    # a batch_sampler and worker processes: torch calls iter(batch_sampler) twice a pass, and the doctor gave the
    # one process the next pass's batches ("did not train on the ranks' global batch"); dropout, which each rank
    # draws for itself: turn it off with the script's own flag, not model.eval() (it also switches BatchNorm)
    (COMPARE, ["--batch-sampler", "--workers", "2", "--dropout", "0.2"], 1, [
        "compare: samples: at each of the 18 steps compared the one process drew the union of the ranks' samples"
        " (of 20 steps in 2 passes: the last step of each pass is left out",
        "compare: 2 ranks and one process differ",
        "switch them off to compare (the model's Dropout(p=0.2): run both with --dropout 0 (the script's own"
        " option); not model.eval()"]),
    # FSDP2 with a 1-element parameter on 2 ranks: rank 1's local shard is empty, and the instruments' step hook
    # crashed the run (`.abs().max()` of nothing), blaming the script's line; its DTensor rows are now put together
    (COMPARE, ["--fsdp2"], 0, ["no findings\ncompare: batch:", "compare: 2 ranks and one process train the same"
                                                               " model"]),
    (DATA, ["--mistakes", "no-sampler,drop-path,batch-norm", "--steps-per-epoch", "5"], 1, [
        f"same-samples: {at(DATA, 'return None, DataLoader(train_set')}: ranks 0 and 1 drew 100% of their samples",
        "same-random-state: tests/scripts/doctor/data_mistakes.py:",
        ": the model has DropPath(p=0.2), and the script draws its random numbers during the steps",
        "one process drew 16: its --batch is per rank (8): the doctor gave one process --batch 16\n",
        "compare: no comparison: at step 1 of training pass 1 the 2 ranks drew 8 samples and the one process 16, 8 of"
        " them the same: the one process did not train on the ranks' global batch: the two runs trained on other"
        " samples"]),
])
def test_compare(script, args, status, expected, launch_env):
    """A per-rank batch flag the doctor can't name, and a summed loss, are lesson 14b's runs; not repeated here."""
    done = doctor_command(script, "-n", 2, "--compare", "--", *args, env=launch_env)
    assert done.returncode == status, done.stdout + done.stderr
    for text in expected:
        assert text in done.stdout, (text, done.stdout)


def test_the_command_line_says_what_it_takes():
    """--help shows the usage; a script's argument given before -- gets one line that shows where it goes."""
    done = doctor_command("--help")
    assert done.returncode == 0 and done.stdout.startswith(f"usage: {USAGE}\n"), done.stdout
    mistaken = doctor_command(DATA, "-n", "2", "--epochs", "2")
    assert (mistaken.returncode, mistaken.stdout) == (2, "")
    assert mistaken.stderr == (f"doctor: --epochs 2 is not the doctor's: the script's own arguments go after --, as in"
                               f" python -m lessons doctor {DATA} -n 2 -- --epochs 2\n")
    missing = doctor_command(ROOT / "no_such_script.py", "-n", "2")
    assert (missing.returncode, missing.stdout.strip()) == (2, f"the script did not run to the end: no such script: "
                                                               f"{ROOT / 'no_such_script.py'}")
    assert lessons.doctor(CRASH, nproc=0).status == 2  # bad input: one line, no launch
    assert subprocess.run([sys.executable, "-m", "lessons", "cure"], cwd=ROOT, capture_output=True).returncode == 2


SPAWNS = FIXTURES / "doctor" / "spawns_under_a_flag.py"


def test_a_spawn_is_refused_when_the_run_spawns_and_odd_output_is_the_scripts_business(launch_env):
    """Like imagenet/main.py: mp.spawn only under a flag. Without it the script runs under the doctor's torchrun, and
    lines that start like the course's RESULT convention but hold no JSON object crash nothing; every event of this
    real run matches lessons/tools/doctor_events.py. With the flag the spawn is refused when called: exit 2, its
    line."""
    from lessons.tools.doctor_events import param_problems, problems

    plain = lessons.doctor(SPAWNS, nproc=2, env=launch_env)
    assert (plain.status, str(plain)) == (0, "no findings"), str(plain)
    events = [e for evs in plain.record.events.values() for e in evs]
    assert {e["event"] for e in events} >= {"start", "init", "sampler", "loader", "pass", "batch", "pass_end",
                                            "optimizer", "wrapper", "exit"}
    assert [p for e in events for p in problems(e)] == []
    names = [name for params in plain.record.params.values() for name in params]
    assert names and [p for name in names for p in param_problems(name)] == []
    spawning = lessons.doctor(SPAWNS, nproc=2, args=["--multiprocessing-distributed"], env=launch_env)
    assert spawning.status == 2, str(spawning)
    assert f"{at(SPAWNS, 'mp.spawn(')}: the script starts its own ranks (torch.multiprocessing.spawn)" \
        in spawning.error, spawning.error
    # PyTorch's "Writing Distributed Applications": torch.multiprocessing.Process, started by spawn. It waited for
    # ranks that never came, until the launch's timeout; now the processes' init_process_group is refused.
    processes = lessons.doctor(SPAWNS, nproc=2, args=["--processes", "spawn"], env=launch_env, timeout=120)
    assert processes.status == 2 and f"{at(SPAWNS, 'dist.init_process_group(')}: the script starts its own ranks" \
        " (multiprocessing's Process, each calling init_process_group)" in processes.error, processes.error


@pytest.mark.parametrize("script, compare", [("digits_lightning.py", False), ("digits_accelerate.py", True)])
def test_a_library_run_is_the_same_run_under_the_doctor(script, compare, tmp_path, launch_env):
    """Lightning rebuilds the loader it shards from DataLoader.__init__'s signature: under instruments that did
    not keep it, batch 1 and 1792 steps. Under the doctor, the batches and steps of the plain run (the plain run's
    weights are compared in benchmarks/doctor_corpus.py's library cases); no finding (the library made the group,
    and its teardown is the library's). Accelerate's loaders take a batch_sampler: --compare gives one process the
    union of the ranks' batches, and it trains the same model."""
    from conftest import SCRIPTS
    from lessons.tools.doctor import passes_of

    report = lessons.doctor(SCRIPTS / script, nproc=2, args=["--batch-size", 64, "--epochs", 1, "--save",
                                                             tmp_path / "doctored.pt"], env=launch_env,
                            compare=compare)
    assert report.status == 0, str(report)
    for rank, events in report.record.events.items():  # 1792 digits, 64 a step over 2 ranks: 28 steps
        trained = [p for p in passes_of(events) if p.trained]
        assert sum(p.batches for p in trained) == 28, (rank, [(p.loader["site"], p.batches) for p in trained])
        assert next(e["steps"] for e in events if e["event"] == "exit") == 28
        assert {p.loader["batch_size"] for p in trained} <= {32, None}  # None: Accelerate's batch_sampler
    if compare:
        assert "compare: 2 ranks and one process train the same model" in str(report), str(report)


CORRECT = FIXTURES / "doctor" / "correct_patterns.py"


def test_correct_code_practitioners_write_gets_no_finding():
    """ZeRO beside DDP, pre-sharded data read by workers, uneven shards under Join, two tasks' loaders from one
    helper, an uneven all_to_all_single, a file per rank (tests/scripts/doctor/correct_patterns.py: the doctor of
    before found four false alarms in it); and the course's own ZeRO-1 by hand, whose optimizers hold each rank's
    shard. False alarms are the rules': decided on the recorded runs of both (lesson 12b launches zero_by_hand.py)."""
    status, text = recorded(f"{CORRECT.relative_to(ROOT)} {{tmp}}")
    assert (status, text) == (0, "no findings"), text
    status, text = recorded("ddp_scripts/zero_by_hand.py")
    assert (status, codes_of(text)) == (0, []), text


def test_a_sampler_seeded_per_rank_is_named_at_any_world_size(tmp_path):
    """seed=dist.get_rank(): at 3 ranks the shards overlap by a third, under any threshold of shared samples; the
    finding names the seeds, not rank=."""
    runs = {rank: clean_run(rank) for rank in (0, 1, 2)}
    for rank in (0, 1, 2):
        next(e for e in runs[rank] if e["event"] == "sampler").update(seed=rank, num_replicas=3)
    write_events(tmp_path, runs)
    found = examine(tmp_path, 3)
    assert [f.code for f in found] == ["same-samples"]
    assert "another seed on each rank (rank 0 seed=0, rank 1 seed=1, rank 2 seed=2)" in found[0].message


def test_loads_the_script_cannot_change_or_that_go_back_where_they_came_from_are_silent(tmp_path):
    """Accelerate's own load_state line (weights_only=False in a library), and a file per rank, saved from the
    rank's own GPU and read back by that rank without map_location."""
    runs = {rank: clean_run(rank) for rank in (0, 1)}
    library = "/venv/lib/python3.11/site-packages/accelerate/checkpointing.py:200"
    for rank in (0, 1):
        own = f"rank{rank}.pt"
        runs[rank][-1:-1] = [
            {"event": "save", "path": own, "site": "t.py:12", "devices": [f"cuda:{rank}"]},
            {"event": "load", "path": own, "site": "t.py:13", "map_location": None, "weights_only": True,
             "saved_from": [f"cuda:{rank}"]},
            {"event": "load", "path": "optimizer.bin", "site": library, "map_location": None,
             "weights_only": False, "saved_from": ["cpu"]}]
    write_events(tmp_path, runs)
    assert examine(tmp_path, 2) == []


def test_compare_says_why_it_cannot_give_one_process_the_batch():
    """A loader with a batch_sampler (every Accelerate loader: batch_size is None) and an iterable data set: exit 2
    and the reason, before a second launch, where it used to crash on None * N."""
    from lessons.tools.doctor import DoctorReport, Record, _compare

    def record(loader):
        events = [{"event": "loader", "loader": 1, "site": "t.py:5", **loader},
                  *training_pass(1, 1, 2, 0)]
        return Record({0: events, 1: events}, {}, {})

    shards = record({"batch_size": None, "sampler_type": "SequentialSampler", "batch_sampler": "BatchSamplerShard"})
    lines, status = _compare("t.py", 2, [], 10, {}, DoctorReport(), shards)
    assert status == 2 and "takes its batches from a batch_sampler (BatchSamplerShard) and its indices were not" \
        " recorded" in lines[0], lines
    stream = record({"batch_size": 4, "sampler_type": "_InfiniteConstantSampler", "batch_sampler": "BatchSampler"})
    lines, status = _compare("t.py", 2, [], 10, {}, DoctorReport(), stream)
    assert status == 2 and "reads an iterable data set" in lines[0], lines


def test_a_one_process_run_in_a_folder_of_its_own_names_sites_as_the_ranks_do(tmp_path, monkeypatch):
    """--one-process-cwd: the one process's sites were relative to its own folder ("../sw/data/build.py:69" where
    the ranks said "data/build.py:69"), so its loader matched none of theirs: its batch was never resized, and the
    doctor said it was. Its sites are now named from the ranks' folder."""
    import importlib.util

    import lessons.tools.doctor_launch as launch_module
    from lessons.tools.doctor import DoctorReport, Record, _compare
    package = SITE_DIR / "_ddp_doctor_instruments"
    spec = importlib.util.spec_from_file_location("_ddp_doctor_instruments", package / "__init__.py",
                                                  submodule_search_locations=[str(package)])
    monkeypatch.setitem(sys.modules, "_ddp_doctor_instruments", importlib.util.module_from_spec(spec))
    instruments = importlib.import_module("_ddp_doctor_instruments.recorder")  # only its functions are used
    (tmp_path / "one").mkdir()
    monkeypatch.chdir(tmp_path / "one")
    monkeypatch.delenv("LESSONS_DOCTOR_SITE_ROOT", raising=False)
    assert instruments.shown_path(str(tmp_path / "data" / "build.py")) == os.path.join("..", "data", "build.py")
    monkeypatch.setenv("LESSONS_DOCTOR_SITE_ROOT", str(tmp_path))
    assert instruments.shown_path(str(tmp_path / "data" / "build.py")) == os.path.join("data", "build.py")
    monkeypatch.delenv("LESSONS_DOCTOR_SITE_ROOT")
    given = []
    monkeypatch.setattr(launch_module, "_run", lambda *args, **kwargs: given.append((args[7], kwargs)) or (
        DoctorReport(error="stopped here"), None))
    events = [{"event": "loader", "loader": 1, "site": "t.py:5", "batch_size": 4, "asked_batch_size": 4,
               "sampler_type": "DistributedSampler", "batch_sampler": "BatchSampler"}, *training_pass(1, 1, 2, 0)]
    for alone, root in (({"cwd": "elsewhere"}, str(tmp_path / "one")), ({}, None)):
        _compare("t.py", 2, [], 10, alone, DoctorReport(), Record({0: events, 1: events}, {}, {}))
        assert given[-1][0].get("LESSONS_DOCTOR_SITE_ROOT") == root, given[-1]


def test_compare_refuses_a_one_process_run_that_resumed_from_the_ranks_file(tmp_path, launch_env):
    """The template with --checkpoint: the one process found the ranks' checkpoint and resumed from it (0 steps);
    'differ' would blame the ranks for it. Exit 2, naming the file."""
    from conftest import SCRIPTS

    checkpoint = tmp_path / "run.pt"
    report = lessons.doctor(SCRIPTS / "template.py", nproc=2, compare=True, env=launch_env,
                            args=["--epochs", 1, "--checkpoint", checkpoint])
    assert report.status == 2, str(report)
    [line] = report.compare
    assert line.startswith(f"compare: no comparison: the run as one process read {checkpoint} at "), line
    load = next(n for n, text in enumerate((SCRIPTS / "template.py").read_text().splitlines(), 1)
                if "torch.load(args.checkpoint" in text)
    assert line.endswith(f"template.py:{load}, which the ranks' run had just written: it resumed from their result"
                         " instead of training from the start. The one process runs with the ranks' arguments,"
                         " environment and folder: give it its own with --one-process-env NAME=VALUE (a folder"
                         " named by the environment) or --one-process-cwd DIR (a relative path), or give the script"
                         " a path that starts from nothing"), line


def test_the_findings_are_ordered_by_severity_and_lesson_14b_lists_every_code():
    severities = [code.severity for code in CODES.values()]
    assert severities == sorted(severities) and set(severities) == {1, 2, 3, NOTE}
    notebook = json.loads((ROOT / "notebooks" / "14b_the_ddp_doctor.ipynb").read_text())
    tables = "".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown")
    listed = set(re.findall(r"^\| `([a-z-]+)` \|", tables, re.M))
    codes = set(CODES) | set(PROFILE_CODES)  # --profile's slowdowns: its section's table
    assert listed == codes, f"14b's tables of codes: missing {codes - listed}, extra {listed - codes}"


@pytest.mark.parametrize("extra", [{}, {"RANK": "0", "LOCAL_RANK": "0", "LESSONS_DOCTOR_RANK_PID": "1"}])
def test_the_instruments_are_inert_outside_a_rank(tmp_path, extra):
    """torchrun's agent (no RANK) and a process a rank starts (another pid) load sitecustomize and do nothing."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "LESSONS_DOCTOR_RANK_PID")}
    env.update({"PYTHONPATH": str(SITE_DIR), "LESSONS_DOCTOR_DIR": str(tmp_path), **extra})
    done = subprocess.run([sys.executable, "-c", "import sys; print('torch' in sys.modules)"], env=env,
                          capture_output=True, text=True)
    assert (done.returncode, done.stdout, list(tmp_path.iterdir())) == (0, "False\n", [])


# --- Each code alone, on what two ranks record ---------------------------------------------------------------

def write_events(tmp_path, per_rank):
    for rank, events in per_rank.items():
        (tmp_path / f"rank{rank}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def training_pass(loader, number, batches, steps, epoch=None, indices=None, ended=True):
    """The events of one pass over a loader during which the optimizer stepped once a batch."""
    events = [{"event": "pass", "loader": loader, "number": number, "steps": steps, "epoch": epoch}]
    events += [{"event": "batch", "loader": loader, "number": number, "n": n + 1, "steps": steps + n}
               for n in range(batches)]
    if ended:
        events.append({"event": "pass_end", "loader": loader, "number": number, "batches": batches,
                       "steps": steps + batches, "indices": indices})
    return events


def clean_run(rank):
    """What rank RANK of a correct 2-rank run records: a sampler, its loader, two epochs, a save and a load."""
    sampler = {"event": "sampler", "sampler": 1, "site": "t.py:5", "num_replicas": 2, "rank": rank,
               "shuffle": True, "seed": 0, "drop_last": False, "dataset": "d", "length": 8}
    loader = {"event": "loader", "loader": 2, "site": "t.py:6", "batch_size": 2, "asked_batch_size": 2,
              "sampler": 1, "sampler_type": "DistributedSampler", "dataset": "d", "length": 8}
    mine = [rank, rank + 2] if rank < 2 else [0, 2]
    return [{"event": "init", "site": "t.py:3", "rank_given": None, "env_rank": rank, "local_rank": rank,
             "world_size": 2}, sampler, loader, {"event": "wrapper", "kind": "DistributedDataParallel",
                                                 "site": "t.py:7"},
            *training_pass(2, 1, 2, 0, epoch=0, indices=mine), *training_pass(2, 2, 2, 2, epoch=1, indices=mine),
            {"event": "collective", "op": "all_reduce", "shape": [[3], "float32"], "site": "t.py:9", "steps": 4},
            *([{"event": "save", "path": "ckpt.pt", "site": "t.py:10", "devices": ["cpu"]}] if rank == 0 else []),
            {"event": "load", "path": "ckpt.pt", "site": "t.py:11", "map_location": "cpu", "weights_only": True,
             "saved_from": None},
            {"event": "exit", "initialized": False, "steps": 4, "optimizers": 1, "ddp_modules": 1,
             "rng_per_step": False}]


def one_mistake(code, tmp_path):
    """What two ranks record for a clean run, with exactly one mistake planted: the doctor's input, no launch."""
    import torch

    runs = {rank: clean_run(rank) for rank in (0, 1)}
    weights = {rank: {"ddp0.weight": torch.ones(2, 2)} for rank in (0, 1)}

    def find(rank, kind):
        return next(e for e in runs[rank] if e["event"] == kind)

    if code == "not-distributed":
        for rank in (0, 1):
            runs[rank] = [e for e in runs[rank] if e["event"] not in ("init", "wrapper", "collective")]
    elif code == "separate-models":
        for rank in (0, 1):
            runs[rank] = [e for e in runs[rank] if e["event"] != "wrapper"]
        weights[1]["ddp0.weight"] = torch.full((2, 2), 2.0)
    elif code == "collectives-differ":
        find(1, "collective")["shape"] = [[2], "float32"]
    elif code == "collective-in-branch":  # t.py:9 is inside `if val_acc > best_acc:`; rank 1 called at t.py:12
        find(1, "collective").update(op="barrier", shape=None, site="t.py:12")
    elif code == "unequal-batches":
        runs[1] = runs[1][:4] + training_pass(2, 1, 1, 0, epoch=0, indices=[1]) + runs[1][4 + 4:]
    elif code == "same-samples":
        for e in runs[1]:
            if e["event"] == "pass_end":
                e["indices"] = [0, 2]
    elif code == "datasets-differ":
        find(1, "loader")["dataset"] = "e"
    elif code == "params-diverged":
        weights[1]["ddp0.weight"] = torch.tensor([[1.0, 1.0], [1.0, 1.25]])
    elif code == "same-random-state":
        for rank in (0, 1):
            find(rank, "exit").update(rng_per_step=True, rng_first_step="3f2a")
            find(rank, "wrapper")["dropout"] = "Dropout(p=0.5)"
    elif code == "no-set-epoch":
        for rank in (0, 1):
            next(e for e in runs[rank] if e["event"] == "pass" and e["number"] == 2)["epoch"] = 0
    elif code == "sampler-recreated":
        for rank in (0, 1):
            runs[rank].insert(8, {**find(rank, "sampler"), "sampler": 3})
            runs[rank].insert(9, {**find(rank, "loader"), "loader": 4, "sampler": 3})
            for e in runs[rank]:
                if e.get("loader") == 2 and e.get("number") == 2:
                    e.update(loader=4, number=1)
            next(e for e in runs[rank] if e["event"] == "pass" and e["loader"] == 4)["epoch"] = 0
    elif code == "rank-from-local-rank":
        find(1, "init")["rank_given"] = 0
    elif code == "save-on-every-rank":
        runs[1].insert(-2, {"event": "save", "path": "ckpt.pt", "site": "t.py:10", "devices": ["cpu"]})
    elif code == "load-without-map-location":
        find(1, "load").update(map_location=None, saved_from=["cuda:0"])
    elif code == "map-location-maps-nothing":
        find(1, "load").update(map_location={"dict": {"cuda:1": "cuda:0"}}, saved_from=["cuda:0"])
    elif code == "weights-only-off":
        find(1, "load")["weights_only"] = False
    elif code == "no-destroy":
        find(0, "exit")["initialized"] = find(1, "exit")["initialized"] = True
    elif code == "padded-evaluation":  # 9 samples on 2 ranks: one repeated; then a pass with no step
        for rank in (0, 1):
            find(rank, "sampler")["length"] = 9
            runs[rank][-1:-1] = [{"event": "pass", "loader": 2, "number": 3, "steps": 4, "epoch": 1},
                                 {"event": "batch", "loader": 2, "number": 3, "n": 1, "steps": 4}]
    elif code == "unreduced-evaluation":  # each rank evaluates its share; nothing combines the results
        for rank in (0, 1):
            runs[rank][-1:-1] = training_pass(2, 3, 2, 4, epoch=1, indices=[rank, rank + 2])
            for e in runs[rank][-4:-1]:
                e["steps"] = 4  # no optimizer step in this pass
    elif code == "map-location-on-gpus":
        find(1, "load").update(map_location=None, saved_from=["cpu"])
    write_events(tmp_path, runs)
    for rank, tensors in weights.items():
        torch.save(tensors, tmp_path / f"rank{rank}.params.pt")


@pytest.mark.parametrize("code", [None, *(code for code in CODES if code != "device-from-global-rank")])
def test_each_code_fires_on_its_one_mistake_alone(code, tmp_path, monkeypatch):
    """The launches above plant several at once; here each alone, so no code fires because of another's mistake.
    (device-from-global-rank is read from the script's text: its own test below.) Each rule decides the same from
    the events it says it reads alone: a rule that reads another event without saying so fails here."""
    monkeypatch.chdir(tmp_path)  # the sites' t.py, which collective-in-branch reads
    (tmp_path / "t.py").write_text("".join(f"line_{n} = {n}\n" for n in range(1, 8)) + (
        "if val_acc > best_acc:\n    dist.all_reduce(x)\n    best_acc = val_acc\n\ndist.barrier()\n"))
    one_mistake(code, tmp_path)
    assert [f.code for f in examine(tmp_path, 2)] == ([code] if code else [])
    rules_read_what_they_say(tmp_path)


def rules_read_what_they_say(tmp_path):
    """Each rule decides the same from the events it says it reads, alone, as from all of them."""
    from lessons.tools.doctor import RULES, Record, read_record
    from lessons.tools.doctor_rules import Facts

    record = read_record(tmp_path, 2)
    for rule in RULES:
        alone = Record({rank: [e for e in evs if e["event"] in rule.reads] for rank, evs in record.events.items()},
                       record.params, {})
        assert [f.code for f in rule.decide(Facts(alone, 2))] == [f.code for f in rule.decide(Facts(record, 2))], \
            rule.codes


def test_every_code_has_one_rule_and_every_rule_reads_described_events():
    """RULES (and STATIC, the script's text) decide each code of CODES once; a rule's events are all in
    lessons/tools/doctor_events.py."""
    from lessons.tools.doctor import RULES, STATIC
    from lessons.tools.doctor_events import FIELDS

    decided = [code for rule in [*RULES, STATIC] for code in rule.codes]
    assert sorted(decided) == sorted(CODES), (set(CODES) ^ set(decided), len(decided), len(set(decided)))
    assert {event for rule in RULES for event in rule.reads} <= set(FIELDS)


def test_what_is_not_a_mistake_stays_silent(tmp_path):
    """The controls of the codes a careless rule would fire on: a load without map_location of a file saved from
    the CPU (only a note: right here, wrong on GPUs); a second pass at the same epoch in which the optimizer never
    stepped (evaluation, over a sampler that pads nothing); a crashed run's missing calls and missing destroy;
    dropout drawn from each rank's own random state."""
    runs = {rank: clean_run(rank) for rank in (0, 1)}
    for rank in (0, 1):
        next(e for e in runs[rank] if e["event"] == "load").update(map_location=None, saved_from=["cpu"])
        runs[rank][-1:-1] = [{"event": "pass", "loader": 2, "number": 3, "steps": 4, "epoch": 1},
                             {"event": "batch", "loader": 2, "number": 3, "n": 1, "steps": 4}]
        runs[rank][-1]["initialized"] = True
        next(e for e in runs[rank] if e["event"] == "wrapper")["dropout"] = "Dropout(p=0.5)"  # dropout, each rank its own
        runs[rank][-1].update(rng_per_step=True, rng_first_step=f"state of rank {rank}")  # state: seed + rank
    runs[1] = [e for e in runs[1] if e["event"] != "collective"]  # rank 1 crashed before its last call
    write_events(tmp_path, runs)
    assert [(f.code, CODES[f.code].severity) for f in examine(tmp_path, 2, crashed=True)] == [
        ("map-location-on-gpus", NOTE)]


GLOBAL_RANK_DEVICES = [  # (source, the note's line or None): the GPU picked by the global rank, and the controls
    ("import torch.distributed as dist\ntorch.cuda.set_device(dist.get_rank())\n", 2),
    ("rank = int(os.environ['RANK'])\ndevice = f'cuda:{rank}'\n", 2),
    ("rank = dist.get_rank()\nmodel = DDP(model.to(rank), device_ids=[rank])\n", 2),
    ("rank = os.environ.get('RANK')\nx = torch.device('cuda', rank)\n", 2),
    ("local_rank = int(os.environ['LOCAL_RANK'])\ndevice = f'cuda:{local_rank}'\n", None),  # nanoGPT's
    ("def main(rank, world_size):\n    model.to(rank)\n", None),  # mp.spawn's process index: a parameter
    ("rank = dist.get_rank()\nrank = int(os.environ['LOCAL_RANK'])\nmodel.cuda(rank)\n", None),  # either
    ("rank = dist.get_rank()\nif rank == 0:\n    torch.save(model.state_dict(), 'm.pt')\n", None),
    ("rank = dist.get_rank()\nx = x.to(device)\n", None),
]


@pytest.mark.parametrize("source, line", GLOBAL_RANK_DEVICES)
def test_a_gpu_picked_by_the_global_rank_is_a_note(source, line, tmp_path):
    """Read from the script's text (the branch never runs on the CPU): only a name that is the global rank and
    nothing else, in a device's place."""
    from lessons.tools.doctor import _device_from_global_rank
    script = tmp_path / "train.py"
    script.write_text(source)
    found = _device_from_global_rank(script)
    assert [f.site.rsplit(":", 1)[1] for f in found] == ([str(line)] if line else [])
    assert all(f.code == "device-from-global-rank" and CODES[f.code].severity == NOTE for f in found)


# --- Decided from what the code did: the parameters, the draws, the ranks' exits -------------------------------

@pytest.mark.parametrize("args, expected", [
    # never wrapped, each rank its own first weights, an all-reduce of the logged loss: the doctor of round 5 said
    # "no findings" (parameters that already differed at the first step were taken for each rank's own by design)
    (["--first-weights", "per-rank", "--log-loss"], [f"separate-models: {at(MODELS, 'optimizer = torch.optim')}:",
                                                     "The ranks' 6 collective(s) while training (all_reduce"]),
    # FSDP1 with dropout under one seed everywhere: its wrapper event carried no dropout, so nothing was said
    (["--wrap", "fsdp1", "--dropout", "0.2"], [f"same-random-state: {at(MODELS, 'optimizer = torch.optim')}: the"
                                               " model has Dropout(p=0.2)"]),
])
def test_what_the_parameters_are_decides(args, expected):
    status, report = recorded(" ".join(["tests/scripts/doctor/models_by_hand.py", *args]))
    assert status == 1 and len(codes_of(report)) == 1, report
    for text in expected:
        assert text in report, (text, report)


def test_torchruns_own_argument_error_is_shown(launch_env):
    """A script's flag that is an ambiguous prefix of torchrun's options: torchrun refuses it before any rank
    starts. The doctor said only that no rank was seen."""
    done = doctor_command(MODELS, "-n", 2, "--", "--start", "per-rank", env=launch_env)
    assert (done.returncode, done.stdout.splitlines()[0]) == (2, (
        "the script did not run to the end: torchrun refused its arguments: ambiguous option: --start could match"
        " --start-method, --start_method: the script's flag is taken for torchrun's own (torchrun reads an option"
        " that is a prefix of one of its own as its own, after the script's name too, and refuses an ambiguous one,"
        " --flag=value as well); put -- between the script and its arguments, which torchrun drops (the doctor's"
        " command then has two: doctor train.py -n 2 -- -- --flag value), or rename the flag")), done.stdout


def two_ranks(tmp_path, change, weights=None):
    """A clean 2-rank run, changed by CHANGE(runs), examined: the codes found."""
    import torch
    runs = {rank: clean_run(rank) for rank in (0, 1)}
    change(runs)
    write_events(tmp_path, runs)
    for rank in (0, 1):
        torch.save((weights or {}).get(rank, {"ddp0.weight": torch.ones(2)}), tmp_path / f"rank{rank}.params.pt")
    return examine(tmp_path, 2)


def draws(runs, indices, length=8, sampler=False, random_state=None):
    """Rank r's training passes draw INDICES[r]; without a DistributedSampler unless SAMPLER; RANDOM_STATE[r]: the
    random state each rank drew its steps' numbers from."""
    for rank, run in runs.items():
        for e in run:
            if e["event"] == "pass_end":
                e["indices"] = indices[rank]
            if e["event"] == "loader":
                e.update(length=length, sampler=1 if sampler else None, sampler_type="RandomSampler")
            if e["event"] == "exit" and random_state:
                e.update(rng_per_step=True, rng_first_step=random_state[rank])
        if not sampler:
            runs[rank] = [e for e in run if e["event"] != "sampler"]


@pytest.mark.parametrize("indices, length, random_state, expected", [
    # every rank draws the whole data set: N times the steps of a sharded epoch
    ([[0, 1, 2, 3], [3, 2, 1, 0]], 4, None, "each rank drew 4 of the data set's 4 samples in the pass, so an epoch is"
                                            " 2 passes over the data: 2 times the steps of a sharded epoch"),
    # repeated augmentation: each rank its share (the step count unchanged), each its own random numbers
    ([[0, 0, 1, 2], [0, 1, 1, 2]], 8, {0: "a", 1: "b"}, None),
    # the same repeats drawn with one random state: copies of a sample, not augmentations
    ([[0, 0, 1, 2], [0, 1, 1, 2]], 8, {0: "a", 1: "a"}, "draws the same samples on every rank with the same random"
                                                        " numbers: 4 samples drawn per rank of 8"),
    # an endless sampler (EDM's InfiniteSampler): one pass of three epochs, each rank its share of each lap
    ([[0, 2, 3, 1, 2, 0], [1, 3, 0, 2, 1, 3]], 4, None, None),
    # indices that name no sample: an endless sampler yields 0 and 1 to a data set that makes each sample itself
    ([[0, 1] * 12, [0, 1] * 12], 1000, None, None),
    # an endless sampler that does not shard: every rank the same order, lap after lap
    ([[0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 0, 1]], 4, None, "(its first 2 draws a rank, one epoch's share): its sampler"
                                                        " (RandomSampler) draws the same samples on every rank"),
])
def test_samplers_are_judged_by_what_they_draw(indices, length, random_state, expected, tmp_path):
    """DeiT's RASampler and timm's RepeatAugSampler put each sample on several ranks by design, each rank drawing
    its share (the step count unchanged) with its own random augmentation: no finding, where round 5 said "N times
    the steps". The same draws with one random state, or a whole data set on every rank, are the mistake, and the
    finding's cost comes from the draws. An endless sampler's one pass spans many epochs: judged on one epoch's
    share (EDM's InfiniteSampler got same-samples: over many laps any two ranks draw every sample)."""
    found = two_ranks(tmp_path, lambda runs: draws(runs, indices, length=length, random_state=random_state))
    assert [f.code for f in found] == (["same-samples"] if expected else []), found
    assert not expected or expected in found[0].message, found[0].message
    rules_read_what_they_say(tmp_path)


def evaluation(runs, indices, collective_after, sampler=True, length=9, each_batch=False, subset=False,
               after_training=False):
    """Each rank's evaluation pass (no step) over a loader of its own site draws INDICES[rank]; then the collective
    COLLECTIVE_AFTER names ("all_reduce", "all_gather", "barrier"), if any: after the pass, after each batch, or
    AFTER_TRAINING went on (a training batch drawn: a loss all-reduced for the log). SUBSET: each rank's loader
    reads its own Subset(test, range(rank, 9, 2)), the indices are into it."""
    for rank, run in runs.items():
        loader = {"event": "loader", "loader": 5, "site": "t.py:20", "batch_size": 2, "asked_batch_size": 2,
                  "sampler": None, "sampler_type": "OrderedDistributedSampler", "dataset": "test", "length": length}
        if subset:
            loader.update(dataset=f"test-of-rank-{rank}", base_dataset="test", base_indices=list(range(rank, 9, 2)),
                          length=len(range(rank, 9, 2)), sampler_type="SequentialSampler")
        extra = [loader, *training_pass(5, 1, 1, 4, indices=indices[rank])]
        for e in extra[1:]:
            e["steps"] = 4
        if after_training:
            extra.append({"event": "pass", "loader": 2, "number": 3, "steps": 4, "epoch": 2})
            extra.append({"event": "batch", "loader": 2, "number": 3, "n": 1, "steps": 4})
        if collective_after:  # a gather of per-sample results holds one row a sample; anything else 2 numbers
            rows = len(indices[rank]) if collective_after == "all_gather" else 2
            extra.insert(-1 if each_batch else len(extra), {
                "event": "collective", "op": collective_after.removesuffix("-counts"), "shape": [[rows], "float32"],
                "site": "t.py:22", "steps": 4})
        if after_training:
            extra.append({"event": "pass_end", "loader": 2, "number": 3, "batches": 1, "steps": 5,
                          "indices": [rank]})
        run[-1:-1] = extra


@pytest.mark.parametrize("indices, collective_after, expected", [
    ([[0, 2, 4, 6, 8], [1, 3, 5, 7, 0]], "all_reduce", ["padded-evaluation"]),  # timm's OrderedDistributedSampler
    ([[0, 2, 4, 6, 8], [1, 3, 5, 7, 0]], "all_reduce each batch", ["padded-evaluation"]),  # a mean reduced per batch
    ([[0, 2, 4, 6, 8], [1, 3, 5, 7]], "all_reduce each batch", []),
    ([[0, 2, 4, 6, 8], [1, 3, 5, 7, 0]], "all_gather", []),  # gathered: de-duplicated (gather_for_metrics)
    # a metric library's counts gathered, then summed (torchmetrics' sync): the padding counts twice
    ([[0, 2, 4, 6, 8], [1, 3, 5, 7, 0]], "all_gather-counts", ["padded-evaluation"]),
    ([[0, 2, 4, 6, 8], [1, 3, 5, 7]], "all_reduce", []),  # exact shares, summed: right
    ([[0, 2, 4, 6, 8], [1, 3, 5, 7]], None, ["unreduced-evaluation"]),  # rank 0 reports its own share
    ([list(range(9)), list(range(9))], None, []),  # every rank evaluates the whole set: nothing to combine
    ([[0, 2, 4, 6, 8], [1, 3, 5, 7]], "barrier", ["unreduced-evaluation"]),  # a barrier carries no data
    ([[0, 2, 4, 6, 8], [1, 3, 5, 7]], "broadcast", ["unreduced-evaluation"]),  # rank 0's own value, to all
    ([[0, 2, 4, 6, 8], [1, 3, 5, 7]], "all_reduce after training", ["unreduced-evaluation"]),  # a loss for the log
    # a Subset per rank (the learner's unpadded shards): indices 0.. into each rank's own Subset, apart beneath
    ([[0, 1, 2, 3, 4], [0, 1, 2, 3]], "subset", ["unreduced-evaluation"]),
    ([[0, 1, 2, 3, 4], [0, 1, 2, 3]], "all_reduce subset", []),
])
def test_evaluations_are_judged_by_what_the_ranks_drew(indices, collective_after, expected, tmp_path):
    """A padding evaluation sampler that is not a DistributedSampler escaped padded-evaluation; a metric computed
    on rank 0 alone got a note about double counting; a metric all-reduced after each batch (inside the pass) was
    called unreduced, and its padding went unsaid. A Subset per rank was taken for another data set on each rank,
    and a barrier, or a loss all-reduced in the next training step, for combining the evaluation's results."""
    words = str(collective_after or "").split()
    op = words[0] if words and words[0] != "subset" else None
    found = two_ranks(tmp_path, lambda runs: evaluation(runs, indices, op, each_batch="each" in words,
                                                        subset="subset" in words, after_training="after" in words))
    assert [f.code for f in found] == expected, found
    rules_read_what_they_say(tmp_path)


def test_a_rank_that_stops_alone_is_named_not_only_the_crash_it_causes(tmp_path):
    """Rank 0 stops after the first epoch on its own decision; rank 1 begins the second and fails (the launch's
    failing rank). Control: the same passes without a failure (a rank-0-only extra pass would be no mistake)."""
    from lessons.tools.doctor import examine_record, read_record

    def stop_early(runs):
        runs[0] = [e for e in runs[0] if not (e.get("loader") == 2 and e.get("number") == 2)]
    two_ranks(tmp_path, stop_early)
    record = read_record(tmp_path, 2)
    found = examine_record(record, 2, crashed=True, failed={1})
    assert [f.code for f in found] == ["unequal-batches"], found
    assert found[0].message.startswith("rank 0 left the training loop after 1 pass(es) over the loader made here"
                                       " (4 steps) and went on to its exit, while rank 1 began pass 2 and failed")
    assert [f.code for f in examine_record(record, 2, crashed=True, failed={0})] == []


@pytest.mark.parametrize("first_sums, at_exit, expected", [
    ([1.0, 2.0], 1.0, ["separate-models"]),  # parted at the first step, equal at exit: copied afterwards
    ([1.0, 1.0], 1.0, []),  # in step at the first step and at exit: gradients averaged by hand
])
def test_an_unwrapped_model_is_judged_by_its_first_step(first_sums, at_exit, expected, tmp_path):
    """No wrapper, collectives while training (a logged loss), weights equal at exit. Only the first step tells
    gradients averaged by hand from separate models made equal at the end."""
    import torch

    def unwrapped(runs):
        for rank in (0, 1):
            runs[rank] = [e for e in runs[rank] if e["event"] != "wrapper"]
            runs[rank][-1:-1] = [{"event": "collective", "op": "all_reduce", "shape": [[1], "float32"],
                                  "site": "t.py:9", "steps": 1}]
    weights = {rank: {"opt0.0": torch.full((2,), at_exit),
                      "firstsum.opt0": torch.tensor([[first_sums[rank], 2.0]], dtype=torch.float64)}
               for rank in (0, 1)}
    assert [f.code for f in two_ranks(tmp_path, unwrapped, weights)] == expected


def test_shards_and_tensors_of_a_ranks_own_are_not_replicas(tmp_path):
    """The instruments name what a parameter is: an FSDP flat shard ("flat.") or a tensor that is no module's
    parameter ("own.": ZeRO's partition written by hand) differs between ranks by design."""
    import torch
    weights = {rank: {"ddp0.weight": torch.ones(2), "flat.opt0.0": torch.full((3,), float(rank)),
                      "own.opt0.1": torch.full((3,), float(rank))} for rank in (0, 1)}
    assert two_ranks(tmp_path, lambda runs: None, weights) == []


def test_the_exit_status_covers_findings_under_compare():
    """A finding of severity 1 to 3 fails the run under --compare too; a note does not."""
    from lessons.tools.doctor import DoctorReport, Finding
    severe = DoctorReport(findings=[Finding("save-on-every-rank", "x")], compare_status=0)
    noted = DoctorReport(notes=[Finding("padded-evaluation", "x")], compare_status=0)
    assert (severe.status, noted.status, DoctorReport(compare_status=2).status) == (1, 0, 2)


def test_compare_names_the_learning_rates_and_takes_a_file_of_its_own_for_its_own(tmp_path):
    """A learning rate scaled with the world size is named; a file the one process wrote itself (rank 0 saves the
    first weights, every rank loads them: PyTorch's DDP tutorial) is not "the ranks' result"."""
    import time

    from lessons.tools.doctor import Record, _compare_reasons, _read_what_the_ranks_wrote

    def run(lrs):
        return Record({0: [{"event": "exit", "first_lrs": [lrs], "steps": 3}]}, {}, {})
    reasons = _compare_reasons(run([0.1]), run([0.05]), {}, {}, [], 2, [3, 3], None)
    assert reasons[0].startswith("compare: why: the learning rates differ: 0.1 on the 2 ranks, 0.05 in one process"
                                 " (at the first step)"), reasons
    assert _compare_reasons(run([0.1]), run([0.1]), {}, {}, [], 2, [3, 3], None) == []
    started = time.time() - 5  # the doctor's clock starts before the launch; a file's time may be coarse
    init = tmp_path / "init.pt"
    init.write_bytes(b"")
    load = {"event": "load", "path": str(init), "site": "t.py:5"}
    own = Record({0: [{"event": "save", "path": str(init), "site": "t.py:4"}, load]}, {}, {})
    assert _read_what_the_ranks_wrote(None, own, started) is None
    theirs = Record({0: [load]}, {}, {})
    assert "which the ranks' run had just written" in _read_what_the_ranks_wrote(None, theirs, started)


@pytest.mark.parametrize("inside", [0, 1])
def test_the_branch_is_named_whichever_rank_took_it(inside, tmp_path, monkeypatch):
    """Rank INSIDE called all_reduce inside `if`; the other rank called barrier after it. Round 7 looked only at
    rank 0's call, and said collectives-differ when the branch was rank 1's."""
    from lessons.tools.doctor_group import _collectives_differ
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("if val_acc > best_acc:\n    dist.all_reduce(x)\n\ndist.barrier()\n")
    calls = {"all_reduce": {"event": "collective", "op": "all_reduce", "shape": [[], "float32"], "site": "t.py:2",
                            "steps": 0},
             "barrier": {"event": "collective", "op": "barrier", "shape": None, "site": "t.py:4", "steps": 0}}
    events = {rank: [calls["all_reduce" if rank == inside else "barrier"]] for rank in (0, 1)}
    found = _collectives_differ(events, crashed=True)
    assert [(f.code, f.site) for f in found] == [("collective-in-branch", "t.py:1")], found
    assert f"rank {inside} entered `if val_acc > best_acc:` at :1" in found[0].message
