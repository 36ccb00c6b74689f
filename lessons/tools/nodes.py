"""Several torchrun agents on one machine, each standing in for a node (lesson 10).

On a cluster you run one torchrun per node, each in its own terminal (or one per node from srun).
``torchrun_nodes()`` starts those agents from a cell, with the guarantees of ``torchrun()``: a timeout
or Ctrl-C stops every agent and every worker, a failing rank raises ``LaunchError``. All on 127.0.0.1.
On one host with GPUs, each agent gets its own slice of them (``gpu_slices``): every agent numbers
LOCAL_RANK from 0, so without it two "nodes" would put their local rank 0 on the same GPU.
With ``workdirs``, each agent (and so each of its workers) runs in its own directory: relative paths land on
that "node's" own disk, as on machines that share no file system.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import processes
from .failure import LaunchError, failure, last_exception
from .launch import _check_arguments, launch_environment, loopback_interface
from .rank_output import LaunchResult, collect, parse_result, print_ranks, read

MAX_NODES = 8
GRACE_AFTER_A_FAILURE_S = 10.0  # the other nodes' ranks fail on their own once a peer is gone; else we stop them


@dataclass
class NodesResult:
    nodes: list[LaunchResult] = field(default_factory=list)  # one per agent, in the order they were started
    result: dict | None = None  # the RESULT of global rank 0, whichever node it ran on
    command_lines: list[str] = field(default_factory=list)  # what you would type on each node


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def visible_gpus(environ: dict[str, str]) -> list[str]:
    """The GPUs the agents may use: CUDA_VISIBLE_DEVICES if set, else every GPU torch counts."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        return [d for d in environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    import torch  # already imported in a notebook kernel; device_count() does not initialise CUDA
    return [str(i) for i in range(torch.cuda.device_count())]


def gpu_slices(nnodes: int, nproc_per_node: int, visible: list[str]) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES for each agent, when several agents share one host.

    Each agent numbers LOCAL_RANK from 0 and a script takes cuda:LOCAL_RANK, so with every GPU visible to
    every agent, global ranks 0 and nproc_per_node would both use GPU 0, and NCCL refuses that at init
    ("Duplicate GPU detected", ncclInvalidUsage). So agent i sees only its own nproc_per_node GPUs. With too
    few GPUs for one each, every agent sees none (""), and the scripts fall back to gloo on the CPU.
    None: no GPU here, nothing to change."""
    if not visible:
        return None
    if len(visible) < nnodes * nproc_per_node:
        return [""] * nnodes
    return [",".join(visible[i * nproc_per_node:(i + 1) * nproc_per_node]) for i in range(nnodes)]


def node_flags(node: int, nnodes: int, nproc_per_node: int, rendezvous: str, port: int,
               min_nodes: int | None = None) -> list[str]:
    """torchrun's flags for agent number ``node``: the part of the command a learner types."""
    flags = [f"--nnodes={min_nodes}:{nnodes}" if min_nodes else f"--nnodes={nnodes}",
             f"--nproc-per-node={nproc_per_node}"]
    if rendezvous == "static":  # you number the nodes; node 0's address is the master
        return flags + [f"--node-rank={node}", "--master-addr=127.0.0.1", f"--master-port={port}"]
    flags += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=lesson10"]
    if min_nodes:  # elastic: start once min_nodes are there and no one else came for 1 s (default 30 s)
        flags.append("--rdzv-conf=last_call_timeout=1")
    return flags


def torchrun_nodes(script: str | os.PathLike, nnodes: int = 2, nproc_per_node: int = 2, args: tuple | list = (),
                   rendezvous: str = "c10d", node_ranks: list[int] | None = None, min_nodes: int | None = None,
                   join_when: str | None = None, timeout: float | None = 120, show: bool = True,
                   env: dict[str, str] | None = None, port: int | None = None,
                   torchrun_flags: tuple | list = (), workdirs: list | None = None) -> NodesResult:
    """Start ``nnodes`` torchrun agents, as ``nnodes`` machines would, and collect every rank.

    ``rendezvous="c10d"``: the agents meet at a store and it numbers the nodes; ``"static"``: each agent is
    given ``--node-rank`` (``node_ranks``, default 0, 1, ...) and node 0's address. ``min_nodes`` makes the job
    elastic (``--nnodes=MIN:MAX``); with ``join_when``, the later agents start only once node 0's rank 0
    has printed that text, so they join a job that is already running. ``port``: the rendezvous port
    (default: one that is free now); 0 lets the c10d store pick one, which works on one node only.
    ``torchrun_flags``: more flags for every agent, e.g. ``["--tee=3", "--local-ranks-filter=0"]``: they show
    in ``command_lines``, and what torchrun prints goes to each node's ``launcher_log``.
    ``workdirs``: one existing directory per node, the working directory of its agent and workers (default: this
    process's); a relative path a script writes then stays on its node, as on machines without a shared disk.
    """
    script, nproc_per_node, args, timeout = _check_arguments(script, nproc_per_node, args, timeout, 1, 0)
    node_ranks = _check_nodes(nnodes, rendezvous, node_ranks, min_nodes)
    workdirs = _check_workdirs(workdirs, nnodes)
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535):
        raise ValueError(f"port must be an int from 0 to 65535, got {port!r}")
    if port == 0 and (nnodes > 1 or rendezvous != "c10d"):
        raise ValueError("port 0 works only for one node with rendezvous='c10d': other nodes could not know the port")
    port = free_port() if port is None else port
    torchrun_flags = [str(f) for f in torchrun_flags]
    for flag in torchrun_flags:
        if not flag.startswith("--") or flag.split("=")[0] in ("--log-dir", "--log_dir", "--redirects"):
            raise ValueError(f"torchrun_flags takes flags such as --tee=3, not {flag!r} (--log-dir and "
                             "--redirects are set by torchrun_nodes)")
    agent_env = launch_environment(env, store_per_round=min_nodes is not None)
    agent_envs = [agent_env] * nnodes
    gpus = visible_gpus(agent_env)
    slices = gpu_slices(nnodes, nproc_per_node, gpus)
    if slices is not None:
        agent_envs = [{**agent_env, "CUDA_VISIBLE_DEVICES": devices} for devices in slices]
        if slices[0] == "":
            print(f"{len(gpus)} GPU(s) for {nnodes} x {nproc_per_node} ranks on one host: "
                  "the agents see no GPU, and the ranks use gloo on the CPU")
    flags = [node_flags(rank, nnodes, nproc_per_node, rendezvous, port, min_nodes) + torchrun_flags
             for rank in node_ranks]
    launched = NodesResult(command_lines=[shlex.join(["torchrun", *f, str(script), *args]) for f in flags])

    with tempfile.TemporaryDirectory(prefix="ddp_lessons_nodes_") as root:
        log_dirs = [Path(root) / f"node{i}" for i in range(nnodes)]
        # An agent in its own working directory would not find a script path relative to ours.
        script_path = str(script.resolve()) if any(workdirs) else str(script)
        commands = [[sys.executable, "-m", "torch.distributed.run", *f, f"--log-dir={d}", "--redirects=3",
                     script_path, *args] for f, d in zip(flags, log_dirs)]
        logs = [open(Path(root) / f"torchrun{i}.log", "wb") for i in range(nnodes)]
        agents = []
        deadline = None if timeout is None else time.monotonic() + timeout
        with _stopped_on_error(agents, logs):
            agents.append(processes.start(commands[0], agent_envs[0], logs[0], cwd=workdirs[0]))
            if join_when and not _wait_for_text(log_dirs[0], join_when, agents[0], deadline):
                codes = [agents[0].poll()]  # node 0 ended, or the time ran out, before it printed join_when
            else:
                agents += [processes.start(c, e, log, cwd=w)
                           for c, e, log, w in zip(commands[1:], agent_envs[1:], logs[1:], workdirs[1:])]
                codes = _wait_all(agents, deadline)
        stopped = sum(processes.stop_tree(agent) for agent in agents) if None in codes else 0
        launched.nodes = [collect(str(d), Path(root) / f"torchrun{i}.log", -9 if c is None else c, command)
                          for i, (d, c, command) in enumerate(zip(log_dirs, codes, commands))]
    launched.result = next((n.result for n in launched.nodes if n.result is not None), None)

    if show:
        for i, node in enumerate(launched.nodes):
            print_ranks(node, label=f"node{i} local{{rank}}", heading=f"node{i} ")
    failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
    if failed:  # the first node that failed on its own; the others may have been stopped after it
        error = failure(script, launched.nodes[failed[0]])
        raise LaunchError(f"node {failed[0]}: {error}", launched.nodes[failed[0]], rank=error.rank,
                          root_cause=error.root_cause)
    if len(codes) < nnodes:
        raise LaunchError(f"the other nodes were never started: node 0 {'ended' if codes[0] is not None else 'timed out'}"
                          f" before its rank 0 printed {join_when!r}", launched.nodes[0])
    if None in codes:
        raise LaunchError(f"{script.name} on {nnodes} nodes timed out after {timeout:g} s; stopped "
                          f"{len(agents)} agent(s) and {stopped} worker process(es)", launched.nodes[0])
    return launched


def python_nodes(script: str | os.PathLike, node_args: list[list], nproc_per_node: int, timeout: float | None = 120,
                 show: bool = True, env: dict[str, str] | None = None) -> list[LaunchResult]:
    """``python SCRIPT ARGS`` once per node, all at once, for a script that starts its own ranks on each node
    (``mp.spawn`` per node): ``node_args[i]`` are node i's arguments. As ``run_python``: a timeout or Ctrl-C
    stops every process, a failure raises ``LaunchError``; lines that start ``rank N`` are grouped by N.
    ``nproc_per_node``: the ranks each node starts, to give each node its own GPUs as ``torchrun_nodes`` does."""
    from .python_launch import by_rank  # here: python_launch imports this package's launch module too
    script, _, _, timeout = _check_arguments(script, 1, (), timeout, 1, 0)
    child_env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": loopback_interface(), **(env or {})}
    child_env.pop("PYTHONUNBUFFERED", None)  # ranks share a stdout: each print() one write
    slices = gpu_slices(len(node_args), nproc_per_node, visible_gpus(child_env)) or [None] * len(node_args)
    envs = [child_env if devices is None else {**child_env, "CUDA_VISIBLE_DEVICES": devices} for devices in slices]
    commands = [[sys.executable, str(script), *map(str, args)] for args in node_args]
    with tempfile.TemporaryDirectory(prefix="ddp_lessons_nodes_") as root:
        outs = [Path(root) / f"node{i}.out" for i in range(len(commands))]
        errs = [Path(root) / f"node{i}.err" for i in range(len(commands))]
        files = [open(path, "wb") for path in outs + errs]
        started = []
        with _stopped_on_error(started, files):
            for command, node_env, out, err in zip(commands, envs, files, files[len(commands):]):
                started.append(processes.start(command, node_env, out, stderr=err))
            codes = _wait_all(started, None if timeout is None else time.monotonic() + timeout)
        stopped = sum(processes.stop_tree(proc) for proc in started) if None in codes else 0
        nodes = [LaunchResult(returncode=-9 if code is None else code, command=command,
                              stdout=by_rank(read(out)), stderr={0: read(err)})
                 for code, command, out, err in zip(codes, commands, outs, errs)]
    for node in nodes:
        node.result = parse_result("\n".join(node.stdout.values()))
    if show:
        for i, node in enumerate(nodes):
            for text in [*node.stdout.values(), node.stderr[0]]:
                sys.stdout.write("".join(f"[node{i}] {line}\n" for line in text.splitlines()))
        sys.stdout.flush()
    failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
    if failed:
        last = last_exception(nodes[failed[0]].stderr[0])
        raise LaunchError(f"node {failed[0]}: {script.name} failed (exit code {codes[failed[0]]}): {last}",
                          nodes[failed[0]], root_cause=last)
    if None in codes:
        raise LaunchError(f"{script.name} on {len(nodes)} nodes timed out after {timeout:g} s; stopped "
                          f"{len(started)} node(s) and {stopped} process(es)", nodes[0])
    return nodes


def _check_nodes(nnodes, rendezvous, node_ranks, min_nodes) -> list[int]:
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or not 1 <= nnodes <= MAX_NODES:
        raise ValueError(f"nnodes must be an int from 1 to {MAX_NODES}, got {nnodes!r}")
    if rendezvous not in ("c10d", "static"):
        raise ValueError(f"rendezvous must be 'c10d' or 'static', got {rendezvous!r}")
    if min_nodes is not None:
        if rendezvous != "c10d":
            raise ValueError("min_nodes (an elastic --nnodes=MIN:MAX) needs rendezvous='c10d'")
        if isinstance(min_nodes, bool) or not isinstance(min_nodes, int) or not 1 <= min_nodes <= nnodes:
            raise ValueError(f"min_nodes must be an int from 1 to nnodes={nnodes}, got {min_nodes!r}")
    if node_ranks is None:
        return list(range(nnodes))
    if rendezvous != "static":
        raise ValueError("node_ranks are for rendezvous='static': with c10d the rendezvous numbers the nodes")
    if len(node_ranks) != nnodes:
        raise ValueError(f"node_ranks needs one --node-rank per node: {nnodes}, got {len(node_ranks)}")
    for rank in node_ranks:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < nnodes:
            # torchrun does not check this: the rendezvous waits, until its timeout, for a node that never comes.
            raise ValueError(f"--node-rank={rank} with --nnodes={nnodes}: node ranks run from 0 to {nnodes - 1}")
    if len(set(node_ranks)) != nnodes:
        raise ValueError(f"each --node-rank must be used once, got {node_ranks}")
    return list(node_ranks)


def _check_workdirs(workdirs, nnodes) -> list[str | None]:
    if workdirs is None:
        return [None] * nnodes  # this process's working directory, for every agent
    if isinstance(workdirs, (str, os.PathLike)) or len(workdirs) != nnodes:
        raise ValueError(f"workdirs needs one directory per node: {nnodes}, got {workdirs!r}")
    missing = [str(w) for w in workdirs if not Path(w).is_dir()]
    if missing:
        raise ValueError(f"workdirs must exist: no directory {', '.join(missing)}")
    return [str(Path(w).resolve()) for w in workdirs]


def _wait_for_text(log_dir: Path, text: str, agent, deadline) -> bool:
    """True once node 0's rank 0 has printed ``text`` (in any attempt); False if node 0 ends or time runs out."""
    while agent.poll() is None and (deadline is None or time.monotonic() < deadline):
        if any(text in read(p) for p in log_dir.glob("*/attempt_*/0/stdout.log")):
            return True
        time.sleep(0.1)
    return False


@contextlib.contextmanager
def _stopped_on_error(started: list, files: list):
    """Whatever ends the block early (Ctrl-C too), every process in ``started`` (so far) is stopped with its tree;
    the output files are closed either way."""
    try:
        yield
    except BaseException:
        with processes.interrupts_ignored():
            for proc in started:
                processes.stop_tree(proc)
        raise
    finally:
        for f in files:
            f.close()


def _wait_all(agents, deadline) -> list[int | None]:
    """Every agent's exit code; None for those still running at the deadline. Once one agent has
    failed, the others get GRACE_AFTER_A_FAILURE_S to end on their own."""
    while True:
        codes = [a.poll() for a in agents]
        if None not in codes:
            return codes
        now = time.monotonic()
        if any(c not in (None, 0) for c in codes):
            deadline = min(deadline or now + GRACE_AFTER_A_FAILURE_S, now + GRACE_AFTER_A_FAILURE_S)
        if deadline is not None and now > deadline:
            return codes
        time.sleep(0.1)
