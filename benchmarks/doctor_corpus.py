"""The doctor's labeled corpus: every case it has, each with the codes it must raise and its --compare verdict.

    .venv/bin/python benchmarks/doctor_corpus.py [--only TEXT] [--sources DIR] [--python PYTHON] [--show]
        [--record-to tests/doctor_corpus]

A case is a script and its arguments: the doctor's own test scripts (tests/scripts/doctor/), the course's scripts
that make a mistake on purpose and their fixes, correct scripts of the course, and the public scripts of
benchmarks/public_scripts.py (when --sources holds them; see that file). Each is labeled, by reading the code, with
- "codes": every code the doctor must report, notes included; any other code it reports is a false alarm;
- "compare": the verdict --compare must give (same, differ, none: no comparison), or absent when not run;
- "status": the exit status, where it is part of the case (a crash: 2).
The doctor runs once a case, from the command line as a user would (with --compare where a verdict is labeled).
Each row: the codes found, missed and raised in error, the verdict, the status, the seconds. Then the totals:
precision and recall of the findings (over every code of every case), --compare right/wrong, and the seconds.
A benchmark, not a test: the results go to benchmarks/LOG.md, with the commit. Every change to the instruments runs
it, and a change that loses a case that passed is not done. --record-to keeps each case's recorded run (the ranks'
events and parameters, launch.json) with its labels (case.json) in a folder of its own: tests/test_doctor_corpus.py
decides every rule again from tests/doctor_corpus/ in seconds, inside make test, so a change to a rule is checked
against every case without a launch (each larger parameter keeps KEPT_ELEMENTS of its elements there: compacted()). Re-record (the command above with --record-to tests/doctor_corpus, and
--sources for the public scripts) when the instruments or the labels change.
"""
import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import public_scripts  # noqa: E402  (the public scripts, their patches and their stand-in data)

DOCTOR = "tests/scripts/doctor/"
CASES = [
    # the doctor's test scripts
    {"script": DOCTOR + "mistakes_then_crash.py", "args": ["{tmp}/ckpt.pt"], "status": 2,
     "codes": ["collectives-differ", "params-diverged", "no-set-epoch", "save-on-every-rank", "weights-only-off",
               "map-location-on-gpus"]},
    {"script": DOCTOR + "mistakes_then_crash.py", "args": ["{tmp}/ckpt.pt", "--fixed"],
     "codes": ["map-location-on-gpus"]},  # a note: a load of CPU tensors without map_location, right here only
    {"script": DOCTOR + "data_mistakes.py", "codes": []},
    {"script": DOCTOR + "data_mistakes.py", "codes": ["separate-models", "datasets-differ", "sampler-recreated",
                                                      "map-location-maps-nothing"],
     "args": ["--mistakes", "no-ddp,unseeded-split,sampler-per-epoch,map-location-empty", "--checkpoint",
              "{tmp}/ckpt.pt"]},
    {"script": DOCTOR + "data_mistakes.py", "args": ["--mistakes", "unequal-shards"], "codes": ["unequal-batches"],
     "status": 2},
    {"script": DOCTOR + "data_mistakes.py", "args": ["--mistakes", "one-replica"], "codes": ["same-samples"]},
    {"script": DOCTOR + "data_mistakes.py", "args": ["--mistakes", "sampler-from-local-rank,save-on-local-rank-0",
                                                     "--checkpoint", "{tmp}/ckpt.pt"],
     "codes": []},  # on one node LOCAL_RANK is the rank: right here
    {"script": DOCTOR + "data_mistakes.py", "args": ["--mistakes", "sampler-from-local-rank,save-on-local-rank-0",
                                                     "--checkpoint", "{tmp}/ckpt.pt"], "nproc": 1, "nodes": 2,
     "codes": ["same-samples", "save-on-every-rank"]},
    {"script": DOCTOR + "data_mistakes.py", "args": ["--global-batch", "--batch", "24", "--bf16"], "nproc": 3,
     "codes": [], "compare": "same"},
    {"script": DOCTOR + "data_mistakes.py", "codes": ["same-samples", "same-random-state"], "compare": "none",
     "args": ["--mistakes", "no-sampler,drop-path,batch-norm", "--steps-per-epoch", "5"]},
    {"script": DOCTOR + "data_mistakes.py", "args": ["--mistakes", "batch-norm"], "codes": [], "compare": "differ"},
    {"script": DOCTOR + "correct_patterns.py", "args": ["{tmp}"], "codes": []},
    {"script": DOCTOR + "spawns_under_a_flag.py", "codes": []},
    {"script": DOCTOR + "spawns_under_a_flag.py", "args": ["--multiprocessing-distributed"], "codes": [],
     "status": 2},
    # models: told apart by what their parameters are
    {"script": DOCTOR + "models_by_hand.py", "args": ["--first-weights", "per-rank", "--log-loss"],
     "codes": ["separate-models"]},
    {"script": DOCTOR + "models_by_hand.py", "args": ["--first-weights", "per-rank"], "codes": ["separate-models"]},
    {"script": DOCTOR + "models_by_hand.py", "args": ["--log-loss"], "codes": ["separate-models"]},
    {"script": DOCTOR + "models_by_hand.py", "args": ["--average-grads", "--log-loss"], "codes": []},
    {"script": DOCTOR + "models_by_hand.py", "args": ["--wrap", "fsdp1", "--dropout", "0.2"],
     "codes": ["same-random-state"]},
    {"script": DOCTOR + "models_by_hand.py", "args": ["--wrap", "fsdp1", "--dropout", "0.2", "--seed-per-rank"],
     "codes": []},
    {"script": DOCTOR + "models_by_hand.py", "args": ["--wrap", "fully-shard", "--dropout", "0.2"],
     "codes": ["same-random-state"]},
    {"script": DOCTOR + "models_by_hand.py", "args": ["--wrap", "fully-shard", "--dropout", "0.2",
                                                      "--seed-per-rank"], "codes": []},
    {"script": DOCTOR + "models_by_hand.py", "args": ["--start", "per-rank"], "codes": [], "status": 2,
     "error": "ambiguous option: --start could match --start-method, --start_method"},
    # samplers and evaluations: judged by what they draw
    {"script": DOCTOR + "samplers.py", "codes": []},
    {"script": DOCTOR + "samplers.py", "args": ["--train", "repeat-aug"], "codes": []},
    {"script": DOCTOR + "samplers.py", "args": ["--train", "whole"], "codes": ["same-samples"]},
    {"script": DOCTOR + "samplers.py", "args": ["--train", "memory-shard", "--workers", "1"], "codes": []},
    {"script": DOCTOR + "samplers.py", "args": ["--train", "memory-shard"], "codes": []},
    {"script": DOCTOR + "samplers.py", "args": ["--train", "memory-same", "--workers", "1"],
     "codes": ["same-samples"]},
    {"script": DOCTOR + "samplers.py", "args": ["--eval", "padded-ordered"], "codes": ["padded-evaluation"]},
    {"script": DOCTOR + "samplers.py", "args": ["--eval", "own-share"], "codes": ["unreduced-evaluation"]},
    {"script": DOCTOR + "samplers.py", "args": ["--eval", "reduced"], "codes": []},
    {"script": DOCTOR + "samplers.py", "args": ["--early-stop-on-rank0"], "codes": ["unequal-batches"], "status": 2},
    {"script": DOCTOR + "samplers.py", "args": ["--train", "epochs-in-a-batch-sampler"], "codes": []},
    {"script": DOCTOR + "samplers.py", "args": ["--train", "epochs-in-a-batch-sampler", "--workers", "1"],
     "codes": []},
    # a learner's own script: "save the best" from an evaluation on each rank's share
    {"script": DOCTOR + "learner_best.py", "args": ["--eval", "subset"], "codes": ["unreduced-evaluation"]},
    {"script": DOCTOR + "learner_best.py", "args": ["--eval", "sampler", "--barrier", "after"],
     "codes": ["unreduced-evaluation"]},
    {"script": DOCTOR + "learner_best.py", "args": ["--eval", "subset", "--barrier", "after", "--log-loss"],
     "codes": ["unreduced-evaluation"]},
    {"script": DOCTOR + "learner_best.py", "args": ["--eval", "reduced", "--barrier", "after", "--log-loss"],
     "codes": []},
    {"script": DOCTOR + "learner_best.py", "args": ["--epochs", "8", "--barrier", "in-branch"], "status": 2,
     "codes": ["collective-in-branch", "unreduced-evaluation"], "doctor": ["--timeout", "30"]},
    {"script": "exercises/find_the_hang/rank_conditional.py", "nproc": 3, "codes": ["collective-in-branch"],
     "status": 2, "doctor": ["--timeout", "20"]},
    {"script": "exercises/solutions/find_the_hang/rank_conditional.py", "nproc": 3, "codes": []},
    {"script": DOCTOR + "spawns_under_a_flag.py", "args": ["--spawn-one"], "codes": []},  # followed into it
    {"script": DOCTOR + "spawns_under_a_flag.py", "args": ["--processes", "fork"], "codes": [], "status": 2,
     "error": "multiprocessing's Process"},
    {"script": DOCTOR + "spawns_under_a_flag.py", "args": ["--processes", "spawn"], "codes": [], "status": 2,
     "error": "multiprocessing's Process"},
    # --compare: the one-process run a user would call equivalent
    {"script": DOCTOR + "compare_cases.py", "codes": [], "compare": "same"},
    {"script": DOCTOR + "compare_cases.py", "args": ["--loss", "sum-over-flag"], "codes": [], "compare": "same"},
    {"script": DOCTOR + "compare_cases.py", "args": ["--loss", "sum"], "codes": [], "compare": "differ"},
    {"script": DOCTOR + "compare_cases.py", "args": ["--scale-lr"], "codes": [], "compare": "differ",
     "expect_line": "learning rate"},
    {"script": DOCTOR + "compare_cases.py", "args": ["--bf16", "--epochs", "32"], "codes": [], "compare": "same"},
    {"script": DOCTOR + "compare_cases.py", "args": ["--bf16", "--epochs", "32", "--loss", "sum"], "codes": [],
     "compare": "differ"},
    {"script": DOCTOR + "compare_cases.py", "args": ["--fsdp1", "--bf16", "--batch-sampler", "--loss",
                                                     "sum-over-flag"], "codes": [], "compare": "same"},
    {"script": DOCTOR + "compare_cases.py", "args": ["--init-file", "{tmp}/init.pt"], "codes": [],
     "compare": "same"},
    {"script": DOCTOR + "compare_cases.py", "args": ["--random-sampler-alone"], "codes": [], "compare": "none"},
    {"script": DOCTOR + "compare_cases.py", "env": {"CHECKPOINT_DIR": "{tmp}/ckpt"}, "codes": [], "compare": "none",
     "expect_line": "--one-process-env"},
    {"script": DOCTOR + "compare_cases.py", "env": {"CHECKPOINT_DIR": "{tmp}/ckpt"}, "codes": [], "compare": "same",
     "doctor": ["--one-process-env", "CHECKPOINT_DIR={tmp}/alone"]},
    {"script": DOCTOR + "compare_cases.py", "args": ["--batch-sampler"], "codes": [], "compare": "same"},
    {"script": DOCTOR + "compare_cases.py", "args": ["--fsdp1"], "codes": [], "compare": "same"},
    {"script": DOCTOR + "compare_cases.py", "args": ["--fsdp2"], "codes": [], "compare": "same"},
    {"script": DOCTOR + "compare_cases.py", "args": ["--batch-sampler", "--workers", "2"], "codes": [],
     "compare": "same"},
    {"script": DOCTOR + "compare_cases.py", "args": ["--dropout", "0.2"], "codes": [], "compare": "differ",
     "expect_line": "--dropout 0"},
    {"script": DOCTOR + "models_by_hand.py", "args": ["--wrap", "fully-shard"], "codes": [], "compare": "none"},
    {"script": DOCTOR + "compare_cases.py", "args": ["--save-on-every-rank", "{tmp}/every.pt"],
     "codes": ["save-on-every-rank"], "compare": "same", "status": 1},
    # the course's scripts: lesson 14b's mistakes and fixes, and correct scripts of other lessons
    {"script": "ddp_scripts/three_mistakes.py", "args": ["{tmp}/three.pt"],
     "codes": ["no-set-epoch", "save-on-every-rank", "weights-only-off", "map-location-on-gpus"]},
    {"script": "ddp_scripts/three_mistakes_fixed.py", "args": ["{tmp}/three.pt"], "codes": []},
    {"script": "ddp_scripts/separate_models.py", "codes": ["separate-models"]},
    {"script": "ddp_scripts/summed_loss.py", "args": ["--reduction", "mean"], "codes": [], "compare": "same"},
    {"script": "ddp_scripts/summed_loss.py", "codes": [], "compare": "differ", "expect_line": "summed"},
    {"script": "ddp_scripts/local_rank_mistakes.py", "args": ["{tmp}/local_rank.pt"], "nproc": 1, "nodes": 2,
     "codes": ["same-samples", "save-on-every-rank"]},
    {"script": "ddp_scripts/digits_single.py", "args": ["--epochs", "1", "--save", "{tmp}/single.pt"],
     "codes": ["not-distributed"], "compare": "none", "absent_line": "per rank"},  # no group: no rank's batch
    {"script": "ddp_scripts/template.py", "args": ["--epochs", "1"], "codes": [], "compare": "same"},
    {"script": "ddp_scripts/template.py", "args": ["--epochs", "1", "--checkpoint", "{tmp}/run.pt"], "codes": [],
     "compare": "none"},
    {"script": "ddp_scripts/zero_by_hand.py", "codes": []},
    {"script": "ddp_scripts/fsdp_vs_ddp.py", "codes": []},
    {"script": "ddp_scripts/hsdp.py", "nproc": 4, "codes": []},
    {"script": "ddp_scripts/pipeline_parallel.py", "codes": []},
    {"script": "ddp_scripts/pipeline_parallel.py", "args": ["--impl", "torch", "--schedule", "1f1b"], "codes": []},
    {"script": "ddp_scripts/tensor_parallel.py", "codes": []},
    {"script": "ddp_scripts/ddp_from_scratch.py", "args": ["--variant", "naive", "bucketed"], "codes": []},
    {"script": "ddp_scripts/uneven_inputs.py", "args": ["--join"], "codes": []},
    {"script": "ddp_scripts/train_resumable.py", "args": ["--epochs", "1", "--checkpoint-dir", "{tmp}/ckpts"],
     "codes": []},
    {"script": "ddp_scripts/digits_ddp.py", "args": ["--epochs", "1", "--save", "{tmp}/model.pt"], "codes": []},
    {"script": "ddp_scripts/digits_lightning.py", "args": ["--batch-size", "64", "--epochs", "1", "--save",
                                                           "{tmp}/model.pt"], "codes": []},
    {"script": "ddp_scripts/digits_accelerate.py", "args": ["--batch-size", "64", "--epochs", "1", "--save",
                                                            "{tmp}/model.pt"], "codes": [], "compare": "same"},
]
PUBLIC = {  # by a part of public_scripts.SCRIPTS' name: the labels, from reading (benchmarks/LOG.md's table)
    "imagenet/main.py": {"codes": ["separate-models", "save-on-every-rank", "no-destroy"], "compare": "none"},
    "FSDP2/example.py": {"codes": [], "compare": "none"},
    "backbone_image_classifier.py": {"codes": [], "compare": "same"},
    "train_fabric.py": {"codes": ["same-random-state"], "compare": "differ"},
    "cv_example.py": {"codes": [], "compare": "differ"},  # a ResNet with BatchNorm: each rank its own statistics
    "main_dino.py": {"codes": ["same-random-state", "no-destroy"], "compare": "none"},
    "ddp_tutorial_multi_gpu.py": {"codes": ["no-destroy"], "compare": "differ",
                                  "nodes_codes": ["same-samples", "save-on-every-rank", "no-destroy"]},
    "train_dist.py": {"codes": ["separate-models", "no-destroy"], "compare": "differ"},
    "mnist/main.py": {"codes": ["no-set-epoch", "no-destroy"], "compare": "same"},
    "nanoGPT train.py": {"codes": [], "compare": "none"},
    "stanford_alpaca train.py": {"codes": ["same-random-state"], "compare": "differ"},
    "NVlabs/edm train.py": {"codes": ["no-destroy"], "compare": "differ"},  # each rank its own noise, by design
    "tczhangzhi/pytorch-distributed": {"codes": ["padded-evaluation", "no-destroy"], "compare": "differ"},  # BN
    "Swin-Transformer main.py": {"codes": ["padded-evaluation", "no-destroy"], "compare": "none"},  # resumes
    "train_fsdp.py (FSDP1)": {"codes": ["no-set-epoch", "no-destroy"], "compare": "differ"},  # unseeded init
    "nautilus_tutorial mnist_ddp.py": {"codes": ["same-random-state", "no-destroy"], "compare": "differ"},
    "DDP-script-torchrun.py": {"codes": ["unreduced-evaluation"], "compare": "same",
                               # two processes claim rank 0: the group never forms (a hang, cut at 60 s)
                               "nodes_codes": ["rank-from-local-rank"], "nodes_status": 2,
                               "nodes_doctor": ["--timeout", "60"]},
    # Hogwild under torchrun: no process ever calls init_process_group; its own Process children (known: a hang)
    "torch-multip main.py (torch.multiprocessing.Process": {"codes": ["not-distributed"], "compare": "none",
                                                            "doctor": ["--timeout", "90"]},
    # LOCAL_RANK as the rank (2 nodes: two claim rank 0, a hang); per-rank seeds and dropout: the one process differs
    "torch-multip main.py --multinode": {"codes": [], "compare": "differ", "doctor": ["--timeout", "90"],
                                         "nodes_codes": ["rank-from-local-rank"], "nodes_status": 2,
                                         "nodes_doctor": ["--timeout", "60"]},
    # its own padded sampler in a BatchSampler (disjoint shares, set_epoch by iteration); it resumes from
    # OUTPUT_DIR's last checkpoint (CheckPointer.load), so the one process starts from the ranks' result
    "lufficc/SSD train.py": {"codes": ["no-destroy"], "compare": "none"},
    # one Trainer seed on every rank, GPT-2's dropout (as stanford_alpaca); workers tokenize
    "MetaMath train_math.py": {"codes": ["same-random-state"], "compare": "differ"},
    # windows drawn at random per rank by design (indices 0/1 only, alike on every rank): not same-samples; the
    # group is Accelerate's, its teardown the library's (the house's rule, as for cv_example.py): no no-destroy
    "mini_llm train_accelerate.py": {"codes": [], "compare": "differ"},
    # FSDP2, rank 1's logit_scale shard empty; synthetic data alike, per-rank seeds unused (no dropout). Alone, its
    # loader draws other indices (no distributed sampler): the doctor compares only what it can check, so no
    # comparison (first labeled same by what the samples hold; the parameters are now put together from the shards)
    "open_clip_train/main.py --fsdp": {"codes": ["no-destroy"], "compare": "none"},
    # each rank's own half of the validation set, never reduced (a loss reduce follows); no set_epoch
    "haofanwang/pytorch-distributed-training main.py": {"codes": ["no-set-epoch", "unreduced-evaluation",
                                                                  "no-destroy"], "compare": "same"},
    # torchmetrics sums the padded shards' counts (63 on 2 ranks); no set_epoch; BatchNorm
    "zjykzj/pytorch-distributed multi_gpu/main.py": {"codes": ["no-set-epoch", "padded-evaluation", "no-destroy"],
                                                     "compare": "differ"},
    # torch.save on every rank at epoch 0; no set_epoch; BatchNorm
    "BigChungusDaddy/DistributedPyTorch": {"codes": ["save-on-every-rank", "no-set-epoch", "no-destroy"],
                                           "compare": "differ"},
    # set_device(RANK % device_count()): the local GPU under torchrun's numbering on nodes alike (read first as
    # device-from-global-rank: that reading was wrong); BatchNorm and random crops
    "chaochen1998/Pytorch-distributed-training-demo": {"codes": ["no-destroy"], "compare": "differ"},
}


def found_codes(stdout: str) -> list[str]:
    codes = []
    for line in stdout.splitlines():
        code = line.removeprefix("note: ").split(":", 1)[0]
        if re.fullmatch(r"[a-z]+(-[a-z]+)+", code):
            codes.append(code)
    return codes


def verdict_of(stdout: str) -> str | None:
    for line in stdout.splitlines():
        if line.startswith("compare: no comparison"):
            return "none"
        if re.match(r"compare: \d+ ranks and one process train the same model", line):
            return "same"
        if re.match(r"compare: \d+ ranks and one process differ", line):
            return "differ"
    return None


def title_of(case) -> str:
    words = [case["script"], *case.get("args", [])]
    if case.get("nproc", 2) != 2 or case.get("nodes"):
        words.append(f"(-n {case.get('nproc', 2)}" + (f" --nodes {case['nodes']})" if case.get("nodes") else ")"))
    words += [f"{k}={v}" for k, v in case.get("env", {}).items()] + case.get("doctor", [])
    return " ".join(words)


def slug(title: str) -> str:
    """A case's folder name in the recorded corpus."""
    return re.sub(r"[^A-Za-z0-9.=-]+", "_", title.replace("tests/scripts/doctor/", "")).strip("_")[:100]


KEPT_ELEMENTS = 256  # of each larger parameter, in the recorded corpus: the same places on every rank


def compacted(record: Path) -> None:
    """A recorded run made small enough to commit: each parameter of more than KEPT_ELEMENTS elements keeps that
    many, evenly spaced, at the same places on every rank (the rules compare the ranks' parameters: a model of one's
    own shows anywhere); --compare's own tensors (start., first.) go, no rule reads them. A ResNet's 270 MB a case
    becomes a few hundred KB."""
    import torch

    for path in sorted(record.glob("rank*.params.pt")):
        tensors = torch.load(path, map_location="cpu", weights_only=True)
        kept = {}
        for name, tensor in tensors.items():
            if name.startswith(("start.", "first.")):
                continue
            if tensor.numel() > KEPT_ELEMENTS:
                places = torch.linspace(0, tensor.numel() - 1, KEPT_ELEMENTS).long()
                tensor = tensor.reshape(-1)[places].clone()
            kept[name] = tensor
        torch.save(kept, path)


def run_doctor(python, script, cwd, case, tmp, record=None):
    fill = lambda text: str(text).replace("{tmp}", tmp)  # noqa: E731
    command = [python, "-m", "lessons", "doctor", script, "-n", str(case.get("nproc", 2))]
    command += ["--record", str(record)] if record else []
    command += ["--nodes", str(case["nodes"])] if case.get("nodes") else []
    command += ["--compare"] if case.get("compare") else []
    command += [fill(a) for a in case.get("doctor", [])]
    command += ["--", *(fill(a) for a in case.get("args", []))]
    env = {**__import__("os").environ, **{k: fill(v) for k, v in case.get("env", {}).items()}}
    started = time.monotonic()
    done = subprocess.run([str(c) for c in command], cwd=cwd, text=True, capture_output=True, env=env,
                          timeout=900)
    return done, time.monotonic() - started


def judge(case, done):
    """(true positives, false positives, false negatives, compare right or None, row's problems)."""
    found, wanted = set(found_codes(done.stdout)), set(case["codes"])
    problems = []
    if case.get("status") is not None and done.returncode != case["status"]:
        problems.append(f"exit {done.returncode}, not {case['status']}")
    elif case.get("status") is None and done.returncode == 2 and not case.get("compare"):
        problems.append("exit 2: did not run to the end")
    if case.get("error") and case["error"] not in done.stdout:
        problems.append(f"does not say {case['error']!r}")
    if case.get("expect_line") and case["expect_line"] not in done.stdout:
        problems.append(f"no line names {case['expect_line']!r}")
    if case.get("absent_line") and case["absent_line"] in done.stdout:
        problems.append(f"a line says {case['absent_line']!r}")
    right = None
    if case.get("compare"):
        verdict = verdict_of(done.stdout)
        right = verdict == case["compare"]
        if not right:
            problems.append(f"compare {verdict}, not {case['compare']}")
    return found & wanted, found - wanted, wanted - found, right, problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="the cases whose script or arguments contain this text")
    parser.add_argument("--sources", type=Path, help="the public scripts' repositories (benchmarks/public_scripts.py)")
    parser.add_argument("--python", type=Path, default=ROOT / ".venv" / "bin" / "python",
                        help="the Python that runs the doctor and the public scripts (default: the course's)")
    parser.add_argument("--show", action="store_true", help="print each run's output")
    parser.add_argument("--record-to", type=Path, metavar="DIR",
                        help="keep each case's recorded run and labels in DIR/<case> (tests/doctor_corpus: the"
                             " replay that tests/test_doctor_corpus.py decides again in seconds)")
    options = parser.parse_args()
    runs = [(case, None) for case in CASES]
    if options.sources:
        for script in public_scripts.SCRIPTS:
            label = next((v for k, v in PUBLIC.items() if k in script["name"]), None)
            if label:
                runs.append(({**label, "script": script["name"]}, script))
                if "nodes_codes" in label:
                    runs.append(({"codes": label["nodes_codes"], "script": script["name"], "nproc": 1, "nodes": 2,
                                  "status": label.get("nodes_status"), "doctor": label.get("nodes_doctor", [])},
                                 script))
    totals = {"tp": 0, "fp": 0, "fn": 0, "right": 0, "wrong": 0, "seconds": 0.0, "cases": 0, "failed": 0}
    recorded = set()
    print("| case | found | missed | false alarms | --compare | exit | s | right |")
    print("|---|---|---|---|---|---|---|---|")
    for case, public in runs:
        title = title_of(case)
        if options.only and options.only not in title:
            continue
        record = None
        if options.record_to:
            record = (options.record_to / slug(title)).resolve()  # the public scripts run in a folder of their own
            if record.name in recorded:  # two titles alike in their first 100 characters: never one over the other
                record = record.with_name(f"{record.name}_{len(recorded)}")
            recorded.add(record.name)
            shutil.rmtree(record, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix="doctor_corpus_") as tmp:
            if public is None:
                done, seconds = run_doctor(options.python, case["script"], ROOT, case, tmp, record)
            else:
                with public_scripts.prepared_copy(public, options.sources, options.python) as (here, name, why):
                    if why:
                        print(f"| {title} | {why} | | | | | | - |")
                        continue
                    case = {**case, "args": public["args"]}
                    done, seconds = run_doctor(options.python, name, here, case, tmp, record)
        if options.show:
            print(done.stdout + done.stderr[-3000:])
        if record is not None and (record / "launch.json").exists():  # the labels beside the run, for the replay
            compacted(record)
            (record / "case.json").write_text(json.dumps({
                "title": title, "codes": sorted(case["codes"]), "status": case.get("status"),
                "compare": case.get("compare"), "error": case.get("error")}, indent=1) + "\n")
        hits, alarms, misses, right, problems = judge(case, done)
        ok = not alarms and not misses and not problems
        totals.update(tp=totals["tp"] + len(hits), fp=totals["fp"] + len(alarms), fn=totals["fn"] + len(misses),
                      seconds=totals["seconds"] + seconds, cases=totals["cases"] + 1,
                      failed=totals["failed"] + (not ok))
        if right is not None:
            totals["right" if right else "wrong"] += 1
        verdict = verdict_of(done.stdout) or ("-" if not case.get("compare") else "?")
        print(f"| {title} | {', '.join(sorted(hits)) or '-'} | {', '.join(sorted(misses)) or '-'} |"
              f" {', '.join(sorted(alarms)) or '-'} | {verdict} | {done.returncode} | {seconds:.1f} |"
              f" {'yes' if ok else 'NO: ' + '; '.join(problems + [f'missed {m}' for m in sorted(misses)] + [f'alarm {a}' for a in sorted(alarms)])} |",
              flush=True)
    tp, fp, fn = totals["tp"], totals["fp"], totals["fn"]
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    summary = {"cases": totals["cases"], "cases_right": totals["cases"] - totals["failed"], "true_findings": tp,
               "false_alarms": fp, "missed": fn, "precision": round(precision, 3), "recall": round(recall, 3),
               "compare_right": totals["right"], "compare_wrong": totals["wrong"],
               "seconds": round(totals["seconds"])}
    print(f"\ntotals: {json.dumps(summary)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
