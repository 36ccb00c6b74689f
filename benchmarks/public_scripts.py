"""The DDP doctor on public training scripts, as TESTING.md asks of a tool: right on code nobody here wrote.

    .venv/bin/python benchmarks/public_scripts.py SOURCES_DIR [--only NAME]

For each script below: its repository, commit and path; the edits that run it on 2 CPU ranks with tiny data (a
patch in benchmarks/public_scripts/, applied with `patch -p1`; only device, backend and sizes change); what a
reviewer saw by reading it. SOURCES_DIR holds each repository at its commit, as SOURCES_DIR/owner+name/ (for
example `git clone https://github.com/pytorch/examples SOURCES_DIR/pytorch+examples` and `git checkout COMMIT`):
nothing is downloaded here, and no source is kept in this repository (their licences and sizes). Each script runs
in a fresh temporary copy of its folder: plainly under torchrun, then under the doctor, then with --compare; the
table's row says what the doctor found, its exit status, --compare's verdict and the seconds plain and doctored.
A benchmark, not a test: the seconds vary with the machine's load. The results go to benchmarks/LOG.md.
"""
import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATCHES = ROOT / "benchmarks" / "public_scripts"
SCRIPTS = [
    {"name": "pytorch/examples imagenet/main.py", "repo": "pytorch/examples",
     "commit": "77f55b912142e11fcfdf5b530231fb9c52f181e8", "path": "imagenet/main.py",
     "patch": "pytorch+examples__imagenet.patch",
     "args": ["--dummy", "-b", "8", "--epochs", "1", "-j", "0", "--dist-backend", "gloo", "--dist-url", "env://"],
     "read": "no DDP on the CPU (separate models); a save on every rank without --multiprocessing-distributed; no"
             " destroy_process_group; mp.spawn only under --multiprocessing-distributed"},
    {"name": "pytorch/examples distributed/FSDP2/example.py", "repo": "pytorch/examples",
     "commit": "77f55b912142e11fcfdf5b530231fb9c52f181e8", "path": "distributed/FSDP2/example.py",
     "patch": "pytorch+examples__FSDP2.patch", "args": [],
     "read": "every rank draws the same random batch (one seed, torch.randint in the loop): no data parallelism,"
             " which no DataLoader shows; a device from LOCAL_RANK (right); a checkpoint through its own class"},
]


def run(command, cwd):
    started = time.monotonic()
    done = subprocess.run([str(c) for c in command], cwd=cwd, text=True, capture_output=True, timeout=900)
    return done, time.monotonic() - started


def examine(script: dict, sources: Path) -> list[str]:
    """One row: the findings' codes, the exit status, --compare's last line, the seconds plain and doctored."""
    repo_dir = sources / script["repo"].replace("/", "+")
    if not (repo_dir / script["path"]).is_file():
        return [script["name"], "-", "-", f"not in {repo_dir}", "-"]
    python = ROOT / ".venv" / "bin" / "python"
    with tempfile.TemporaryDirectory() as work:
        folder = Path(script["path"]).parent
        shutil.copytree(repo_dir / folder, Path(work) / folder)
        patched = subprocess.run(["patch", "-p1", "-i", PATCHES / script["patch"]], cwd=work, text=True,
                                 capture_output=True)
        if patched.returncode:
            return [script["name"], "-", "-", f"the patch did not apply: {patched.stdout.strip()[:80]}", "-"]
        here, name = Path(work) / folder, Path(script["path"]).name
        plain, plain_s = run([ROOT / ".venv" / "bin" / "torchrun", "--standalone", "--nproc-per-node=2", name,
                              *script["args"]], here)
        doctored, doctored_s = run([python, "-m", "lessons", "doctor", name, "-n", "2", "--", *script["args"]], here)
        compared, _ = run([python, "-m", "lessons", "doctor", name, "-n", "2", "--compare", "--",
                           *script["args"]], here)
    codes = [line.split(":", 1)[0] for line in doctored.stdout.splitlines() if line and not line.startswith(
        ("the script", "no findings"))]
    verdict = next((line for line in reversed(compared.stdout.splitlines()) if line.startswith("compare:")), "-")
    return [script["name"], ", ".join(codes) or "no findings", f"{doctored.returncode} (plain {plain.returncode})",
            verdict.removeprefix("compare: ")[:90], f"{plain_s:.1f} / {doctored_s:.1f}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", type=Path, help="the repositories, as SOURCES/owner+name/ at their commits")
    parser.add_argument("--only", help="one script, by a part of its name")
    options = parser.parse_args()
    print("| script (commit) | read before running | found | exit | --compare | seconds, plain / doctored |")
    print("|---|---|---|---|---|---|")
    for script in SCRIPTS:
        if options.only and options.only not in script["name"]:
            continue
        name, found, status, compare, seconds = examine(script, options.sources)
        print(f"| {name} ({script['commit'][:7]}) | {script['read']} | {found} | {status} | {compare} | {seconds} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
