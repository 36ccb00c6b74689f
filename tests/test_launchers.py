"""Lessons 10 and 10b: launchers, init methods, several nodes on one machine, and a real Slurm.

Notebooks 10 and 10b run each launcher at 2 ranks, each init method once, and 2 nodes x 2 processes; here are
the other sizes, the failures, the bad input, and what the notebook cannot run: the Slurm templates. Lesson 10's own
launches check, by nbval: torch.distributed.launch's FutureWarning, its --local-rank=N that an old parser rejects
(root cause), the fixed script given LOCAL_RANK; and the stale file:// init file refused in one line, then the path
working once the file is deleted.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

import lessons
from conftest import FIXTURES, SCRIPTS
from lessons import slurm
from lessons.tools.nodes import free_port, gpu_slices, python_nodes


def test_unknown_launcher_is_refused_in_one_line():
    with pytest.raises(ValueError, match="launcher must be one of"):
        lessons.torchrun(SCRIPTS / "tiny_train.py", launcher="mpirun")


@pytest.mark.parametrize("method", ["env", "tcp", "file"])
def test_each_init_method_at_3_ranks(method, launch_env):
    run = lessons.run_python(SCRIPTS / "init_methods.py", ["--init-method", method, "--world-size", "3"],
                             env=launch_env, show=False, timeout=60)
    lines = [text.strip() for rank, text in run.stdout.items() if rank >= 0]
    assert len(lines) == 3 and all(line.endswith("all_reduce of rank+1 = 6") for line in lines)


def test_a_tcp_address_nobody_listens_on_is_reported_within_the_timeout(launch_env):
    port = free_port()  # free a moment ago: nobody listens there
    start = time.monotonic()
    with pytest.raises(lessons.LaunchError) as error:
        lessons.run_python(SCRIPTS / "init_methods.py", ["--init-method", "tcp", "--address", f"127.0.0.1:{port}",
                                                         "--ranks", "1", "--timeout", "2"],
                           env=launch_env, show=False, timeout=60)
    elapsed = time.monotonic() - start
    assert str(error.value).endswith("did not meet within 2 s (is every rank started, "
                                                     "and is the address one they all reach?)")
    # The 2 s timeout, plus starting Python and importing torch (slower while the notebooks run on the other
    # xdist worker); the 30 s default would be over.
    assert elapsed < 2 + 20


def test_2_nodes_of_3_processes_number_their_ranks(launch_env):
    run = lessons.torchrun_nodes(SCRIPTS / "where_am_i.py", nnodes=2, nproc_per_node=3, env=launch_env,
                                 show=False, timeout=90)
    assert run.result["world_size"] == 6 and run.result["group_formed"] and run.result["arithmetic_holds"]
    assert [(r["node_rank"], r["local_rank"]) for r in run.result["ranks"]] == [(n, l) for n in (0, 1) for l in range(3)]


@pytest.mark.parametrize("workdirs, text", [
    (["."], "workdirs needs one directory per node: 2"),
    (".", "workdirs needs one directory per node: 2"),
    ([".", "/no/such/dir"], "workdirs must exist: no directory /no/such/dir"),
])
def test_bad_workdirs_are_refused_in_one_line(workdirs, text):
    with pytest.raises(ValueError, match=text):
        lessons.torchrun_nodes(SCRIPTS / "where_am_i.py", workdirs=workdirs)


def test_mp_spawn_on_each_node_numbers_the_ranks_across_nodes(launch_env):
    nodes = python_nodes(SCRIPTS / "launch_spawn.py", nproc_per_node=1, timeout=120, show=False,
                         env={**launch_env, "MASTER_PORT": str(free_port())},
                         node_args=[["--nprocs=1", "--nnodes=2", f"--node-rank={node}"] for node in (0, 1)])
    assert [sorted(r for r in node.stdout if r >= 0) for node in nodes] == [[0], [1]]  # node x 1 + local index
    assert nodes[0].result["world_size"] == 2 and nodes[0].result["weights_equal_on_every_rank"]
    assert nodes[0].result["launcher"] == "mp.spawn"  # the script's default start method, one child per node


@pytest.mark.parametrize("node_ranks, text", [
    ([0, 2], "--node-rank=2 with --nnodes=2: node ranks run from 0 to 1"),
    ([1, 1], "each --node-rank must be used once"),
])
def test_bad_node_ranks_are_refused_in_one_line(node_ranks, text):
    with pytest.raises(ValueError, match=text):
        lessons.torchrun_nodes(SCRIPTS / "where_am_i.py", rendezvous="static", node_ranks=node_ranks)


@pytest.mark.parametrize("gpus", [8, 4, 6])
def test_two_nodes_on_one_gpu_host_get_a_gpu_each(gpus):
    """Each agent numbers LOCAL_RANK from 0 and takes cuda:LOCAL_RANK: the physical GPU of every global rank
    must differ, or NCCL refuses the group ("Duplicate GPU detected")."""
    nnodes, nproc = 2, 2
    slices = gpu_slices(nnodes, nproc, [str(i) for i in range(gpus)])
    physical = [slices[node].split(",")[local] for node in range(nnodes) for local in range(nproc)]  # by global rank
    assert len(set(physical)) == nnodes * nproc, physical


def test_too_few_gpus_for_the_nodes_fall_back_to_the_cpu_and_no_gpu_changes_nothing():
    assert gpu_slices(2, 2, ["0", "1"]) == ["", ""]  # no GPU visible: backend_and_device() picks gloo on the CPU
    assert gpu_slices(2, 2, []) is None
    assert gpu_slices(2, 2, ["3", "5", "6", "7"]) == ["3,5", "6,7"]  # an outer CUDA_VISIBLE_DEVICES is honoured


@pytest.mark.parametrize("flag", ["--log-dir=/tmp/x", "--redirects=0", "tee"])
def test_torchrun_flags_that_would_break_the_launcher_are_refused_in_one_line(flag):
    with pytest.raises(ValueError, match="torchrun_flags takes flags such as --tee=3"):
        lessons.torchrun_nodes(SCRIPTS / "where_am_i.py", torchrun_flags=[flag])


def test_run_python_timeout_stops_the_script_and_its_children(launch_env, monkeypatch):
    """spawn_hang.py's children (multiprocessing's spawn, as mp.spawn's, but without the SIGINT that mp.spawn's get
    when their parent dies) outlive the script: only run_python's clean-up ends them, once its grace is over."""
    monkeypatch.setattr(lessons.tools.processes, "STOP_GRACE_S", 1)  # nobody here stops on SIGTERM but the script itself
    with pytest.raises(lessons.LaunchError, match="timed out after 3 s") as error:
        lessons.run_python(FIXTURES / "spawn_hang.py", env=launch_env, show=False, timeout=3)
    assert sorted(error.value.result.stdout) == [0, 1]  # both children had started, and hung: there was work to do
    # launch_env's teardown asserts that no process is left.


def test_sbatch_absent_is_one_line(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        slurm.submit(tmp_path / "job.sbatch", cwd=tmp_path, env={"PATH": str(tmp_path)})
    assert str(error.value) == slurm.NO_SLURM


@pytest.mark.parametrize("template", ["one_node.sbatch", "multi_node.sbatch"])
def test_the_sbatch_templates_ask_for_what_a_cluster_needs(template):
    """The lines that render_for_cpu() changes for this machine, checked as written."""
    text = (SCRIPTS / "slurm" / template).read_text()
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", text, re.M))
    gpus_per_node = int(directives["gres"].removeprefix("gpu:"))
    assert re.search(rf"^PROCS_PER_NODE={gpus_per_node}\b", text, re.M), "one process per GPU of --gres"
    assert directives["ntasks-per-node"] == "1"  # one torchrun per node
    assert int(directives["cpus-per-task"]) >= gpus_per_node  # at least a core per worker
    srun = re.search(r"^srun (.*?)torchrun", text, re.M | re.S).group(1)
    # Slurm >= 22.05: srun does not read SLURM_CPUS_PER_TASK; without the flag every task gets one core.
    assert '--cpus-per-task="$SLURM_CPUS_PER_TASK"' in srun and "--kill-on-bad-exit=1" in srun, srun
    if int(directives["nodes"]) > 1:  # the rendezvous port: one per job, not a constant two jobs share
        assert re.search(r"^PORT=\$\(\(\d+ \+ SLURM_JOB_ID % \d+\)\)", text, re.M)
        assert '--rdzv-endpoint="$HEAD_NODE:$PORT"' in text


# --- A real Slurm: Debian's slurm-wlm and munge, brought up by the course's own script ---

CLUSTER = SCRIPTS / "slurm" / "local_cluster.sh"


def slurm_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root"
    missing = [tool for tool in ("sbatch", "slurmctld", "slurmd", "munged") if shutil.which(tool) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing; `make test` installs it where it is root)"
    return None


@pytest.fixture(scope="module")
def slurm_cluster():
    reason = slurm_unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Slurm test: {reason}")
        pytest.skip(reason)
    # Not under tmp_path: munged refuses a socket in a directory that other users cannot reach.
    cluster_dir = Path(tempfile.gettempdir()) / f"ddp_lessons_slurm_{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "CLUSTER_DIR": str(cluster_dir), "SLURM_CONF": str(cluster_dir / "slurm.conf")}
    up = subprocess.run([CLUSTER, "up"], env=env, capture_output=True, text=True, timeout=60)
    if up.returncode != 0:
        subprocess.run([CLUSTER, "down"], env=env, capture_output=True, timeout=60)
        pytest.fail(f"local_cluster.sh up failed: {up.stderr.strip()}")
    daemons = [int((cluster_dir / name).read_text()) for name in ("slurmctld.pid", "slurmd.pid", "munge/munged.pid")]
    try:
        yield env
    finally:
        subprocess.run([CLUSTER, "down"], env=env, capture_output=True, timeout=60)
        left = [pid for pid in daemons if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
        assert left == [], f"Slurm daemons left running: {left}"
        steps = [p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "slurmstepd"]
        assert steps == [], f"job steps left running: {steps}"


@pytest.mark.parametrize("template, procs_per_node, cpus_per_task, world_size, nodes", [
    ("one_node.sbatch", 2, 2, 2, 1),
    ("multi_node.sbatch", 1, 1, 2, 2),  # two tasks on the one machine, each a torchrun standing in for a node
])
def test_the_sbatch_templates_run_under_a_real_slurm(slurm_cluster, tmp_path, template, procs_per_node,
                                                     cpus_per_task, world_size, nodes):
    job = tmp_path / template
    job.write_text(slurm.render_for_cpu((SCRIPTS / "slurm" / template).read_text(), procs_per_node, cpus_per_task))
    # The job's torchrun: the one of the Python running this test (not ROOT/.venv, which a worktree or another
    # environment does not have: "execve(): torchrun: No such file or directory").
    env = {**slurm_cluster, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
           "TMPDIR": str(tmp_path)}  # torchrun without --log-dir leaves a torchelastic_* directory in TMPDIR
    env.pop("MASTER_PORT", None)  # multi_node.sbatch derives its port from the job id
    test_only = subprocess.run(["sbatch", "--test-only", str(job)], cwd=SCRIPTS.parent, env=env,
                               capture_output=True, text=True)
    assert test_only.returncode == 0 and "to start at" in test_only.stderr, test_only.stderr
    job_id = slurm.submit(job, cwd=SCRIPTS.parent, env=env)  # the templates run ddp_scripts/where_am_i.py
    state = slurm.wait(job_id, timeout=90, env=env)
    output = SCRIPTS.parent / f"{state['JobName']}-{job_id}.out"
    try:
        text = output.read_text()
    finally:
        output.unlink(missing_ok=True)
    assert state["JobState"] == "COMPLETED", f"job {job_id}: {state.get('JobState')}\n{text}"
    ranks = sorted(line for line in text.splitlines() if line.startswith("node "))
    assert len(ranks) == world_size, text
    result = lessons.parse_result(text)
    assert result["world_size"] == world_size and result["nodes"] == nodes
    assert result["group_formed"] and result["arithmetic_holds"]
