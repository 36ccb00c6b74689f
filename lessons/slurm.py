"""Submit the course's sbatch templates to a Slurm cluster, and wait for them (lesson 10).

The templates in ddp_scripts/slurm/ ask for GPUs. ``render_for_cpu()`` turns one into a job a
one-machine cluster (``ddp_scripts/slurm/local_cluster.sh up``) can run: no --gres, one process per
task, and several tasks on the one node, each standing in for a node.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

NO_SLURM = "sbatch not found: Slurm is not installed here (apt-get install slurm-wlm munge; then "\
           "ddp_scripts/slurm/local_cluster.sh up)"
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL")


def render_for_cpu(template: str, procs_per_node: int = 1, cpus_per_task: int = 1) -> str:
    """The template without GPUs: drop --gres, run ``procs_per_node`` processes per torchrun, and put
    all of --nodes=N's tasks on one node (--nodes=1 --ntasks-per-node=N)."""
    nodes = int(re.search(r"^#SBATCH --nodes=(\d+)", template, re.M).group(1))
    lines = {
        r"#SBATCH --gres=.*\n": "",
        r"#SBATCH --nodes=.*": "#SBATCH --nodes=1                  # one machine",
        r"#SBATCH --ntasks-per-node=.*": f"#SBATCH --ntasks-per-node={nodes}        # each task a torchrun, standing in for a node",
        r"#SBATCH --cpus-per-task=.*": f"#SBATCH --cpus-per-task={cpus_per_task}          # cores for its processes",
        r"PROCS_PER_NODE=.*": f"PROCS_PER_NODE={procs_per_node}                   # processes on the CPU, not GPUs",
    }
    for pattern, replacement in lines.items():
        template = re.sub("^" + pattern, replacement, template, flags=re.M)
    return template

def submit(script: str | Path, cwd: str | Path, env: dict | None = None) -> int:
    """``sbatch --parsable SCRIPT`` from ``cwd``; the job id."""
    if shutil.which("sbatch", path=(env or {}).get("PATH")) is None:
        raise FileNotFoundError(NO_SLURM)
    done = subprocess.run(["sbatch", "--parsable", str(script)], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"sbatch refused {Path(script).name}: {done.stderr.strip()}")
    return int(done.stdout.strip().split(";")[0])


def job_state(job_id: int, env: dict | None = None) -> dict[str, str]:
    """JobState, ExitCode, StdOut... from ``scontrol show job`` (no accounting database needed)."""
    done = subprocess.run(["scontrol", "show", "job", str(job_id)], env=env, capture_output=True, text=True)
    return dict(re.findall(r"(\w+)=(\S*)", done.stdout))


def wait(job_id: int, timeout: float, env: dict | None = None) -> dict[str, str]:
    """Poll until the job has finished; on timeout, cancel it and raise TimeoutError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = job_state(job_id, env)
        if state.get("JobState") in FINISHED:
            return state
        time.sleep(0.5)
    subprocess.run(["scancel", str(job_id)], env=env, capture_output=True)
    raise TimeoutError(f"job {job_id} did not finish in {timeout:g} s (state {state.get('JobState')}); cancelled it")
