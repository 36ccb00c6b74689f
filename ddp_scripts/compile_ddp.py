"""torch.compile with DDP: how many graphs Dynamo hands the compiler, against DDP's gradient buckets.

    TORCH_LOGS=graph_breaks torchrun --standalone --nproc-per-node=2 ddp_scripts/compile_ddp.py

outer: torch.compile(DDP(model)); inner: DDP(torch.compile(model)); each with optimize_ddp on and off, for a
model class of your own (MLP) and an nn.Sequential of the same layers. The backend counts the graphs Dynamo
hands it and runs them uncompiled (no inductor, no C compiler).
"""
import json
import time

import torch
import torch._dynamo
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_common import backend_and_device  # import before init_process_group

STEPS = 3
BUCKET_CAP_MB = 1  # below 1 MiB, DDPOptimizer refuses: its first bucket (1 MiB, as DDP's) must not be the largest


class MLP(torch.nn.Module):  # a model class of your own, as most are

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(512, 512) for _ in range(6))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def make_model(kind):  # the same layers either way
    torch.manual_seed(0)
    return MLP() if kind == "MLP" else torch.nn.Sequential(
        *[layer for _ in range(6) for layer in (torch.nn.Linear(512, 512), torch.nn.ReLU())])


def run(kind, wrap, optimize_ddp, device):
    torch._dynamo.reset()  # forget graphs compiled for the previous case
    torch._dynamo.utils.counters.clear()
    torch._dynamo.config.optimize_ddp = optimize_ddp
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(sum(node.op == "call_function" for node in graph_module.graph.nodes))  # ops in the graph
        return graph_module.forward  # run it as traced, uncompiled

    buckets = {"count": 0}

    def counting_hook(group, bucket):  # DDP calls it once per bucket it all-reduces
        buckets["count"] += 1
        return allreduce_hook(group, bucket)

    model = make_model(kind).to(device)  # six 1 MiB weights: about one bucket each
    device_ids = [device.index] if device.type == "cuda" else None
    if wrap == "outer":
        ddp = DDP(model, device_ids=device_ids, bucket_cap_mb=BUCKET_CAP_MB)
        ddp.register_comm_hook(None, counting_hook)
        step_model = torch.compile(ddp, backend=counting_backend)
    else:
        step_model = DDP(torch.compile(model, backend=counting_backend), device_ids=device_ids,
                         bucket_cap_mb=BUCKET_CAP_MB)
        step_model.register_comm_hook(None, counting_hook)
    x = torch.randn(16, 512, device=device)
    seconds = []
    for _ in range(STEPS):
        buckets["count"] = 0
        start = time.perf_counter()
        step_model(x).sum().backward()
        seconds.append(time.perf_counter() - start)
    breaks = sorted(reason.splitlines()[0] for reason in torch._dynamo.utils.counters["graph_break"])
    return {"graphs": len(graphs), "ops_per_graph": graphs, "buckets_last_step": buckets["count"],
            "graph_breaks": breaks, "keys": list(step_model.state_dict())[:1],
            "first_step_s": seconds[0], "last_step_s": seconds[-1]}


def main():
    backend, device = backend_and_device()
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    cases = {f"{kind} {wrap} optimize_ddp={on}": run(kind, wrap, on, device)
             for kind in ("MLP", "Sequential") for wrap in ("outer", "inner") for on in (True, False)}
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(cases))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
